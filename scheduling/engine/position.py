"""Position of a waiting request and its ETA, cheap with many waiting (no sort per query).

Position is 1 + the waiting requests for the same model that the dispatch order at ``now_ms`` would
start first (preempt stage, lanes ranked ahead, its tenant's earlier requests, a fair-share
projection of other tenants); ``exact`` says whether it equals a replay of dispatch. How it is
counted: docs/engine.md, "Position and ETA".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from .dispatching import PreemptEntry
from .fairness import Lane, Rank, TenantQueue
from .model import FairnessMode
from .store import WAITING, Ticket

RankKey = Callable[[Lane], Rank]


def preempt_rank(ticket: Ticket, preempt_heap: list[PreemptEntry]) -> int:
    """Number of preempt-stage requests ordered before ``ticket`` (which is at preempt)."""
    mine = None
    for entry in preempt_heap:
        if entry[-1] is ticket:
            mine = entry[:-1]
            break
    if mine is None:
        return 0
    ahead = 0
    for entry in preempt_heap:
        other = entry[-1]
        if other is not ticket and other.state == WAITING and other.promoted and entry[:-1] < mine:
            ahead += 1
    return ahead


def requests_ahead(
    ticket: Ticket, lanes: Iterable[Lane], rank: RankKey, preempt_heap: list[PreemptEntry], boosted: bool
) -> tuple[int, bool]:
    """(requests dispatched before ``ticket``, exact?) for a waiting ticket."""
    if ticket.promoted:
        return preempt_rank(ticket, preempt_heap), True
    lane, tq = ticket.lane, ticket.tq
    assert lane is not None and tq is not None, "a waiting ticket is in a lane and a tenant queue"
    own_rank = rank(lane)
    ahead = 0
    for other in lanes:
        ahead += other.promoted
        if other is not lane and other.live and rank(other) < own_rank:
            ahead += other.live - other.promoted
    within, exact = _ahead_in_lane(ticket, lane, tq)
    return ahead + within, exact and not boosted and lane.promoted == tq.promoted


def _ahead_in_lane(ticket: Ticket, lane: Lane, tq: TenantQueue) -> tuple[int, bool]:
    behind_head = ticket.tq_no - tq.head_no - tq.promoted  # preempt-stage ones are counted already
    exact = tq.dead == 0
    if exact:
        own = behind_head
    else:
        own = max(0, behind_head - round(tq.dead * behind_head / max(len(tq.items), 1)))
    if lane.fifo:
        return own, exact
    others = 0
    backlogged = 0
    unit = _unit(tq, lane.mode)
    level = tq.counter + own * unit
    for other in lane.tenants.values():
        queued = other.live - other.promoted
        if other is tq or queued <= 0:
            continue
        backlogged += 1
        if level > other.counter:
            others += min(queued, math.ceil((level - other.counter) / _unit(other, lane.mode)))
    return own + others, exact and backlogged == 0


def _unit(tq: TenantQueue, mode: FairnessMode) -> float:
    if mode == FairnessMode.WEIGHTED_ROUND_ROBIN:
        return 1.0 / tq.weight
    mean_cost = tq.cost_sum / tq.live if tq.live else 1.0
    return max(mean_cost, 1.0) / tq.weight


def eta_ms(ahead: int, free_slots: int, rate_per_ms: float) -> int:
    must_start = ahead + 1 - max(free_slots, 0)
    if must_start <= 0:
        return 0
    if rate_per_ms <= 0:
        return -1
    return math.ceil(must_start / rate_per_ms)
