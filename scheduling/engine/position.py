"""Position of a waiting request, cheap with tens of thousands waiting (no sort per query).

Position = 1 + the waiting requests *for the same model* that the ordering at ``now_ms`` would
dispatch first, assuming no arrivals, aging or expiry (lane ranks frozen at ``now_ms``):

1. requests already at preempt (EDF stage) come first. For a request itself at preempt its rank
   in that stage is counted by one scan of the model's preempt heap: exact, O(requests at
   preempt).
2. whole lanes (classes) ranked ahead of the request's lane: O(lanes), from live counts.
3. inside its lane: the requests of its own tenant ahead of it (from FIFO numbering, less its
   tenant's preempt-stage requests, which are its oldest: exact unless cancelled/expired
   requests are still marked inside that tenant's deque, then estimated by spreading them
   evenly), plus a fair-share projection of other tenants: tenant
   ``u`` serves while its counter stays below the counter the request's tenant will have when
   the request comes up, ``ceil((C - c_u) / unit_u)`` requests (at most its backlog), where
   ``unit_u`` is its mean queued cost over its weight. O(tenants in the lane).

``exact`` is True when the answer equals a brute-force replay of dispatch at frozen ``now_ms``:
no lane of the model is boosted (a boost changes as a lane's oldest request leaves), the
preempt-stage requests of its lane all belong to its own tenant, the tenant deque has no marked entries ahead
and the lane is FIFO or has a single backlogged tenant. Otherwise it is an estimate (the fair
projection assumes every tenant's queued requests cost their mean).

The ETA divides the requests that must start before it by the model's dispatch rate: the
larger of the rate measured over 60 s and the model's slots over the mean service time.
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
