"""Fair sharing between tenants inside one lane (a class, for one model).

Modes: ``weighted_fair_tokens`` (a virtual token counter per tenant, lifted on return from idle),
``weighted_round_robin`` (the same counter per request) and ``fifo``. FIFO within a tenant; requests
that leave other than from a queue head are removed lazily. Weights: ``max(quota_share,
min_share)``, renormalised. The rules and why: docs/engine.md, "Fair sharing".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from heapq import heapify, heappop, heappush
from typing import TypeAlias

from .model import FairnessMode, TenantSpec
from .store import WAITING, SchedulerStore, Ticket

# A lane's dispatch rank (see ``dispatching``): ``(level - boost, level, enqueued_ms, id)`` of its
# oldest request not at preempt, or ``(inf,)`` when it has none; the smallest tuple wins.
Rank: TypeAlias = tuple[float, int, int, str] | tuple[float]
# An age-heap entry: (preempt-order key ms, id, ticket).
AgeEntry: TypeAlias = tuple[int, str, Ticket]


def tenant_weights(tenants: Iterable[TenantSpec], min_share: float) -> tuple[dict[str, float], float]:
    """(weight per tenant slug, weight of a tenant not in the list), weights summing to 1."""
    raw = {t.slug: max(t.quota_share, min_share) for t in tenants}
    total = sum(raw.values())
    if total <= 0:
        return {slug: 1.0 for slug in raw}, 1.0
    unknown = (min_share / total) if min_share > 0 else 1.0 / max(len(raw), 1)
    return {slug: w / total for slug, w in raw.items()}, unknown


class TenantQueue:
    __slots__ = (
        "key",
        "store_key",
        "items",
        "head_no",
        "live",
        "dead",
        "promoted",
        "cost_sum",
        "counter",
        "version",
        "weight",
    )

    def __init__(self, key: str, store_key: tuple[str, str, str], counter: float, weight: float) -> None:
        self.key = key
        self.store_key = store_key  # (lane class, model, tenant): where the store keeps its counter
        self.items: deque[Ticket] = deque()
        self.head_no = 0  # number of items[0]; a ticket's tq_no is its number
        self.live = 0
        self.dead = 0  # marked-gone tickets still in ``items``
        self.promoted = 0  # live tickets in the preempt stage (the oldest, so at the front)
        self.cost_sum = 0  # fair cost (tokens) of live tickets
        self.counter = counter
        self.version = 0
        self.weight = weight

    def head(self) -> Ticket | None:
        items = self.items
        while items:
            first = items[0]
            if first.state == WAITING and first.tq is self and first.tq_no == self.head_no:
                return first
            items.popleft()
            self.head_no += 1
            self.dead -= 1
        return None

    def tail(self) -> Ticket | None:
        """The newest live ticket (the last its tenant would be served); drops marked ones behind it."""
        items = self.items
        while items:
            last = items[-1]
            if last.state == WAITING and last.tq is self and last.tq_no == self.head_no + len(items) - 1:
                return last
            items.pop()
            self.dead -= 1
        return None


class Lane:
    """Waiting requests of one class (or of every class, for ``single_queue``) for one model."""

    __slots__ = (
        "name",
        "model",
        "level",
        "mode",
        "fifo",
        "by_tokens",
        "tenants",
        "heap",
        "live",
        "promoted",
        "vt",
        "age",
        "weights",
        "unknown_weight",
        "store",
        "key",
        "sla_ms",
        "rank",
        "rank_entry",
        "rank_valid_ms",
    )

    def __init__(
        self,
        name: str,
        model: str,
        level: int,
        mode: FairnessMode,
        weights: dict[str, float],
        unknown_weight: float,
        store: SchedulerStore,
    ) -> None:
        self.name = name
        self.model = model
        self.key = (name, model)
        self.sla_ms = 0  # class SLA (class lanes), for the wait ratio of the oldest request
        self.level = level
        self.mode = mode
        self.fifo = mode == FairnessMode.FIFO
        self.by_tokens = mode == FairnessMode.WEIGHTED_FAIR_TOKENS  # charge tokens, not requests
        self.tenants: dict[str, TenantQueue] = {}
        self.heap: list[tuple[float, int, str, int]] = []
        self.live = 0
        self.promoted = 0  # live tickets already in the preempt stage
        self.vt = 0.0  # counter of the tenant served last (virtual time)
        self.age: list[AgeEntry] = []  # kept by Scheduler
        # The dispatcher's cached rank: computed for the age-heap entry ``rank_entry`` and valid
        # for ``rank_valid_ms[0] <= now_ms < rank_valid_ms[1]`` while that entry is still the top.
        self.rank: Rank | None = None
        self.rank_entry: AgeEntry | None = None
        self.rank_valid_ms: tuple[float, float] = (0, 0)
        self.weights = weights
        self.unknown_weight = unknown_weight
        self.store = store

    def queue_for(self, tenant: str) -> TenantQueue:
        key = "" if self.fifo else tenant
        tq = self.tenants.get(key)
        if tq is None:
            weight = 1.0 if self.fifo else self.weights.get(key, self.unknown_weight)
            store_key = (self.name, self.model, key)
            stored = self.store.fair_counter_get(store_key)
            tq = self.tenants[key] = TenantQueue(key, store_key, stored if stored is not None else self.vt, weight)
        return tq

    def push(self, ticket: Ticket, front: bool = False, lift: bool = True) -> None:
        """Queue ``ticket`` (at its tenant's front for a 429 requeue); ``lift=False`` on rebuilds."""
        tq = self.queue_for(ticket.tenant)
        if tq.live == 0 and lift:
            floor = self.min_backlogged()
            tq.counter = max(tq.counter, self.vt if floor is None else floor)
        if front:
            tq.head_no -= 1
            ticket.tq_no = tq.head_no
            tq.items.appendleft(ticket)
        else:
            ticket.tq_no = tq.head_no + len(tq.items)
            tq.items.append(ticket)
        ticket.tq = tq
        ticket.lane = self
        tq.live += 1
        tq.cost_sum += ticket.cost_tokens
        self.live += 1
        if tq.live == 1 or front:
            self._reheap(tq)

    def min_backlogged(self) -> float | None:
        if self.fifo:
            return None
        heap = self.heap
        tenants = self.tenants
        while heap:
            top = heap[0]
            tq = tenants[top[2]]
            if top[3] == tq.version and tq.live > 0:
                return top[0]
            heappop(heap)
        return None

    def peek(self) -> Ticket | None:
        """The lane's fair-share pick: the head of the backlogged tenant with the smallest counter."""
        if self.live == 0:
            return None
        if self.fifo:
            tq = self.tenants.get("")
            return tq.head() if tq is not None else None
        if self.min_backlogged() is None:
            return None
        return self.tenants[self.heap[0][2]].head()

    def vip_pick(self) -> Ticket | None:
        """Among backlogged tenants whose head request is VIP, the fair-share choice (O(tenants)).

        Used when the lane's pick cannot be placed: reserved slots and fallback backends serve
        VIP requests only, so a VIP head must not wait behind a non-VIP one that cannot run.
        """
        if self.fifo:
            return None
        best = None
        best_key = None
        for tq in self.tenants.values():
            if tq.live == 0:
                continue
            head = tq.head()
            if head is not None and head.vip and (best_key is None or (tq.counter, head.qseq) < best_key):
                best, best_key = head, (tq.counter, head.qseq)
        return best

    def detach(self, ticket: Ticket) -> None:
        """Ticket leaves the lane (dispatched, cancelled, expired); O(1), lazily for non-heads."""
        tq = ticket.tq
        assert tq is not None, "only a waiting ticket is in a lane"
        items = tq.items
        if items and items[0] is ticket and ticket.tq_no == tq.head_no:
            items.popleft()
            tq.head_no += 1
        else:
            tq.dead += 1
        ticket.tq = None
        ticket.lane = None
        tq.live -= 1
        tq.cost_sum -= ticket.cost_tokens
        self.live -= 1
        if ticket.promoted:
            self.promoted -= 1
            tq.promoted -= 1
        if tq.live == 0:
            tq.head_no += len(items)
            items.clear()
            tq.dead = 0
            tq.version += 1

    def charge(self, ticket: Ticket, tq: TenantQueue, picked: bool) -> None:
        """Charge ``tq`` for dispatching ``ticket`` (after :meth:`detach`); ``picked``: by fair pick."""
        if self.fifo:
            return
        unit = (ticket.cost_tokens if self.by_tokens else 1) / tq.weight
        if picked:
            self.vt = tq.counter
        ticket.charge = unit
        ticket.charge_lane = self.key
        ticket.charge_by_tokens = self.by_tokens
        self.adjust(tq, unit)

    def adjust(self, tq: TenantQueue, delta: float) -> None:
        tq.counter += delta
        self.store.fair_counter_set(tq.store_key, tq.counter)
        if tq.live > 0:
            self._reheap(tq)

    def _reheap(self, tq: TenantQueue) -> None:
        if self.fifo:
            return
        tq.version += 1
        head = tq.items[0] if tq.items else None
        heappush(self.heap, (tq.counter, head.qseq if head is not None else 0, tq.key, tq.version))
        if len(self.heap) > 4 * len(self.tenants) + 64:
            self.heap = [(q.counter, q.items[0].qseq, q.key, q.version) for q in self.tenants.values() if q.live > 0]
            heapify(self.heap)
