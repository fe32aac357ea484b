"""The dispatch decision (mixed into :class:`~scheduling.engine.scheduler.Scheduler`).

Order of a dispatch round at ``now_ms`` (one round fills every slot it can):

1. **Preempt stage.** Requests whose wait ratio reached the preempt bound ``a3`` are moved
   from their lane's age heap into their model's preempt heap, keyed
   ``(deadline, level, enqueued_ms, id)`` with deadline ``min(enqueued + sla, client deadline)``.
   While any such request waits, its lane is served before everything that is not at preempt,
   earliest deadline first across classes (and so across lanes), bypassing the cross-class
   choice. The slot goes to the lane's *fair-share pick*, not necessarily to the promoted
   request itself. Preempt answers "which class is owed service now"; fairness still answers
   "who inside the class". This departs from a per-request EDF on purpose: when one class is
   overloaded (admission lets about one SLA of work in, so most of its requests reach ``a3``),
   a per-request EDF turns the class into one FIFO and a flooding tenant buries the small ones
   (measured on ``sim/scenarios/small-tenant.json``: small tenants' mean wait 8.9 s with
   per-request EDF, 0.8 s with the fair pick; Jain index on ``on-off`` 0.80 → 0.9997). The
   promoted request is its tenant's FIFO head, so it goes as soon as fairness reaches its
   tenant; an over-share tenant's requests may then time out, which is where overload belongs.
2. **Cross-class choice.** Every lane (class x model) with waiting requests competes with
   ``level - boost(wait_ratio of its oldest waiting request)``; ties go to the lower level, then
   the earlier enqueue, then the request id. The oldest request has the highest ratio of its
   class (one SLA per class), so this costs O(lanes) per decision, not O(requests).
3. **Fair pick.** The winning lane serves its fair-share pick (see ``fairness``), which may be
   a younger request of another tenant than the oldest one that lifted the class. This is
   intended: aging decides *which class* is owed service; fairness decides *who inside the
   class* receives it, so a flooding tenant's old requests cannot drag its own younger ones
   ahead of other tenants. The oldest request is not left behind for long: its own ratio keeps
   rising, and at ``a3`` the preempt stage gives its class every slot until fairness reaches it.

**Deadline rescue** (``headroom.rescue_ms`` > 0, off by default and in the presets). Whichever
stage gives a lane the slot, a waiting request of that lane whose deadline is within ``rescue_ms``
is served before the fair-share pick, earliest deadline first among those at risk (ties: earlier
enqueue, then id); its tenant is charged as usual, but the lane's virtual time does not move to it.
It answers the one case the fair pick gets wrong: a few requests of one class waiting while slots
turn over slowly (the top class at a ramp's peak, its held slots used up), where the fair order
serves other tenants' newer requests and the oldest one expires. The margin keeps it narrow: an
overloaded class whose requests all come within the margin becomes earliest deadline first for that
last stretch only, the fair pick having ordered them until then (``bench/REPORT.md``). Each lane
keeps its waiting requests in a deadline heap (one push per request; entries of those that left
are dropped lazily at the top and compacted like the age heap); off, nothing is kept or read.

Head-of-line blocking across models: lanes are per model, and a pick that no backend can take
now (slots, reserved slots, TPM/RPM, 429 hold) blocks only its own lane (or, in the preempt
stage, its model's preempt heap) for the rest of the round; other lanes and models go on.
Before blocking a lane whose pick is not VIP, the lane's best VIP tenant head is tried, since
reserved slots and fallback backends may still take it (not in FIFO lanes: strict order).
A blocked big request may thus be overtaken by smaller ones of other lanes while a TPM window
is nearly full. With ``single_queue`` there is one lane per model holding every class in FIFO
order, level 0, no boost (the ``fifo`` preset).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Never, TypeAlias

from .admission import RateWindow
from .aging import AgingCurve
from .capacity import Capacity
from .class_plans import ClassPlan
from .counters import Counters, Tally, TenantInClass, wait_bucket
from .fairness import Lane, Rank
from .headroom import Headroom
from .outcomes import Grant
from .store import RUNNING, WAITING, SchedulerStore, Ticket

# A preempt-heap entry: (deadline ms, level, enqueued_ms, id, ticket).
PreemptEntry: TypeAlias = tuple[int, int, int, str, Ticket]
# A rescue-heap entry (one heap per lane): (deadline ms, enqueued_ms, id, ticket).
RescueEntry: TypeAlias = tuple[int, int, str, Ticket]
RESCUE_SLACK = 1024  # stale rescue-heap entries tolerated beyond twice a lane's waiting requests

_NO_RANK: Rank = (float("inf"),)
_NOTHING_BLOCKED: frozenset[Never] = frozenset()  # empty, so it stands for no models and for no lanes


class DispatchMixin:
    """Needs the attributes that :class:`Scheduler` sets up (lanes, heaps, capacity, plans, ...)."""

    # Set up and kept by Scheduler (declared here for the type checker; no values at class level).
    counters: Counters
    _store: SchedulerStore
    _store_holds_live_tickets: bool
    _capacity: Capacity
    _aging: AgingCurve
    _lanes_age: bool
    _plans: dict[str, ClassPlan]
    _books: dict[tuple[str, str], TenantInClass]
    _lane_list: list[Lane]
    _preempt: dict[str, list[PreemptEntry]]
    _promote_due_ms: float
    _waiting: int
    _promoted: int
    _running_by_cls: dict[str, int]
    _started_sum: dict[str, int]
    _model_rate: dict[str, RateWindow]
    _unqueue: Callable[[Ticket], None]
    headroom: Headroom
    _rescue_ms: int
    _rescue: dict[tuple[str, str], list[RescueEntry]]
    rescued: int

    def dispatch(self, *, now_ms: int) -> list[Grant]:
        grants: list[Grant] = []
        capacity = self._capacity
        headroom = self.headroom
        if headroom.holds:  # ended holds go, those beyond the need or the free slots go (``headroom``)
            headroom.refresh(now_ms)
        if not self._waiting or not capacity.any_free(now_ms):
            return grants
        if self._aging.preempt_ratio is not None and self._promote_due_ms <= now_ms:
            self._promote(now_ms)
        # Lanes and models that cannot be placed this round; sets only once something blocks.
        blocked_models: set[str] | frozenset[str] = _NOTHING_BLOCKED
        blocked_lanes: set[Lane] | frozenset[Lane] = _NOTHING_BLOCKED
        while True:
            ticket = self._preempt_top(blocked_models) if self._promoted else None
            if ticket is not None:
                assert ticket.lane is not None, "a ticket at preempt is waiting, so in a lane"
                pick, rescued = self._pick(ticket.lane, now_ms)  # the class is owed the slot; fairness picks who
                if not self._try_grant(pick or ticket, now_ms, True, False, grants, rescued):
                    blocked_models = blocked_models | {ticket.model}
                continue
            lane, boosted = self._best_lane(now_ms, blocked_lanes)
            if lane is None:
                break
            ticket, rescued = self._pick(lane, now_ms)
            if ticket is None or not self._try_grant(ticket, now_ms, ticket.promoted, boosted, grants, rescued):
                vip = lane.vip_pick() if ticket is not None and not ticket.vip else None
                if vip is None or not self._try_grant(vip, now_ms, vip.promoted, boosted, grants):
                    blocked_lanes = blocked_lanes | {lane}
                continue
            if not self._waiting or not capacity.any_free(now_ms):
                break
        return grants

    def _pick(self, lane: Lane, now_ms: int) -> tuple[Ticket | None, bool]:
        """The lane's next request and whether the rescue chose it: its earliest deadline when that is
        within ``rescue_ms`` of ``now_ms``, else its fair-share pick."""
        if self._rescue_ms:
            heap = self._rescue.get(lane.key)
            while heap:
                deadline_ms, _, _, ticket = heap[0]
                if ticket.state == WAITING and ticket.lane is lane:
                    if deadline_ms - now_ms <= self._rescue_ms:
                        return ticket, True
                    break
                heappop(heap)
        return lane.peek(), False

    def _rescue_push(self, lane: Lane, ticket: Ticket, deadline_ms: int) -> None:
        heap = self._rescue.get(lane.key)
        if heap is None:
            heap = self._rescue[lane.key] = []
        heappush(heap, (deadline_ms, ticket.enqueued_ms, ticket.id, ticket))

    def _rescue_compact(self, lane: Lane) -> None:
        """Drop the lane's rescue entries of requests that left it, once they outnumber the waiting
        ones by far (only the top is checked lazily). The live entries keep their total order."""
        heap = self._rescue.get(lane.key)
        if heap is None or len(heap) <= 2 * lane.live + RESCUE_SLACK:
            return
        seen: set[str] = set()
        live: list[RescueEntry] = []
        for entry in heap:
            ticket = entry[3]
            if ticket.state == WAITING and ticket.lane is lane and entry[2] not in seen:
                seen.add(entry[2])
                live.append(entry)
        heap[:] = live
        heapify(heap)

    def _promote(self, now_ms: int) -> None:
        """Move every request at or past the preempt bound into its model's preempt heap.

        Also sets ``_promote_due_ms`` to the earliest preempt time still ahead (the smallest live
        age-heap top); ``_enqueue`` lowers it. Until then no request can reach preempt, so
        dispatch skips this scan of every lane.
        """
        due_ms = float("inf")
        for lane in self._lane_list:
            age = lane.age
            while age:
                key_ms, rid, ticket = age[0]
                if ticket.state != WAITING or ticket.lane is not lane or ticket.promoted:
                    heappop(age)
                    continue
                if key_ms > now_ms:
                    due_ms = min(due_ms, key_ms)
                    break
                heappop(age)
                assert ticket.tq is not None, "a waiting ticket is in a tenant queue"
                ticket.promoted = True
                lane.promoted += 1
                ticket.tq.promoted += 1
                self._promoted += 1
                heappush(self._preempt_heap(ticket.model), self._preempt_key(ticket))
        self._promote_due_ms = due_ms

    def _preempt_key(self, ticket: Ticket) -> PreemptEntry:
        plan = self._plans[ticket.cls]
        deadline = plan.deadline_ms(ticket.enqueued_ms, ticket.request.deadline_ms)
        return (deadline, plan.level, ticket.enqueued_ms, ticket.id, ticket)

    def _preempt_heap(self, model: str) -> list[PreemptEntry]:
        heap = self._preempt.get(model)
        if heap is None:
            heap = self._preempt[model] = []
        return heap

    def _preempt_top(self, blocked_models: set[str] | frozenset[str]) -> Ticket | None:
        best: PreemptEntry | None = None
        for model, heap in self._preempt.items():
            if model in blocked_models:
                continue
            while heap:
                ticket = heap[0][-1]
                if ticket.state == WAITING and ticket.promoted:
                    break
                heappop(heap)
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return None if best is None else best[-1]

    def _oldest(self, lane: Lane) -> Ticket | None:
        """The lane's oldest waiting request not yet in the preempt stage (lazy heap top)."""
        age = lane.age
        while age:
            ticket = age[0][2]
            if ticket.state == WAITING and ticket.lane is lane and not ticket.promoted:
                return ticket
            heappop(age)
        return None

    def _book(self, cls: str, tenant: str) -> TenantInClass:
        key = (cls, tenant)
        book = self._books.get(key)
        if book is None:
            book = self._books[key] = TenantInClass(*self.counters.pair(cls, tenant))
        return book

    def _rank(self, lane: Lane, now_ms: int) -> Rank:
        """``(level - boost, level, enqueued_ms, id)`` of the lane's oldest request not at preempt.

        Cached on the lane: the rank changes only when the oldest request changes (a new age-heap
        top, or the top leaving the lane) or, with aging, once its wait ratio earns a boost.
        """
        age = lane.age
        if age:
            top = age[0]
            ticket = top[2]
            valid_from_ms, valid_until_ms = lane.rank_valid_ms
            if (
                top is lane.rank_entry
                and lane.rank is not None  # set with rank_entry
                and valid_from_ms <= now_ms < valid_until_ms
                and ticket.state == WAITING
                and ticket.lane is lane
                and not ticket.promoted
            ):
                return lane.rank
        oldest = self._oldest(lane)  # drops entries of requests that left
        if oldest is None:
            return _NO_RANK
        lane.rank, lane.rank_valid_ms = self._fresh_rank(lane, oldest, now_ms)
        lane.rank_entry = age[0]
        return lane.rank

    def _fresh_rank(self, lane: Lane, oldest: Ticket, now_ms: int) -> tuple[Rank, tuple[float, float]]:
        """The rank of ``lane`` whose oldest request is ``oldest``, and the ms range it holds for."""
        level = lane.level
        if not self._lanes_age:
            return (level, level, oldest.enqueued_ms, oldest.id), (-math.inf, math.inf)
        aging = self._aging
        ratio = (now_ms - oldest.enqueued_ms) / lane.sla_ms
        if ratio < aging.no_boost_below:  # no boost yet, none before no_boost_until_ms (ratio rises with time)
            valid_ms = (-math.inf, aging.no_boost_until_ms(oldest.enqueued_ms, lane.sla_ms))
            return (level - 0.0, level, oldest.enqueued_ms, oldest.id), valid_ms
        return (level - aging.boost(ratio), level, oldest.enqueued_ms, oldest.id), (now_ms, now_ms + 1)

    def _best_lane(self, now_ms: int, blocked: set[Lane] | frozenset[Lane]) -> tuple[Lane | None, bool]:
        """The lane of smallest rank, and whether it won over a lower level thanks to aging."""
        best = None
        best_rank = _NO_RANK
        min_level = None  # of the lanes that compete; the first one's, as ``_lane_list`` is sorted by level
        for lane in self._lane_list:
            if lane.live <= lane.promoted or lane in blocked:
                continue
            rank = self._rank(lane, now_ms)
            if rank is _NO_RANK:
                continue
            if min_level is None:
                min_level = lane.level
            if rank < best_rank:
                best, best_rank = lane, rank
        boosted = best is not None and min_level is not None and best.level > min_level
        return best, boosted

    def _try_grant(
        self, ticket: Ticket, now_ms: int, preempt: bool, boosted: bool, grants: list[Grant], rescued: bool = False
    ) -> bool:
        plan = self._plans[ticket.cls]
        capacity = self._capacity
        headroom = self.headroom
        if headroom.hold_idle and not preempt and not plan.privileged:
            headroom.hold_idle_slot(ticket.model, now_ms)  # an idle slot may become a hold first (``headroom``)
        if headroom.holds and not preempt and not plan.privileged and headroom.held_back(ticket.model, now_ms):
            return False  # the free slots are held for the top class's forecast arrivals
        backend = capacity.place(ticket.model, ticket.vip or plan.privileged, ticket.vip, ticket.est_tokens, now_ms)
        if backend is None:
            return False
        lane, tq = ticket.lane, ticket.tq
        assert lane is not None and tq is not None, "a waiting ticket is in a lane and a tenant queue"
        self._unqueue(ticket)
        lane.charge(ticket, tq, not preempt and not rescued)  # only the fair pick moves the lane's virtual time
        if rescued:
            self.rescued += 1
        ticket.state = RUNNING
        ticket.backend = backend.name
        ticket.dispatched_ms = now_ms
        ticket.window_handle = capacity.occupy(backend, ticket.est_tokens, now_ms)
        self._running_by_cls[ticket.cls] = self._running_by_cls.get(ticket.cls, 0) + 1
        self._started_sum[ticket.cls] = self._started_sum.get(ticket.cls, 0) + now_ms
        if headroom.holds and plan.privileged:
            headroom.used(ticket.model, now_ms)
        plan.dispatch_rate.add(now_ms)
        self._model_rate[ticket.model].add(now_ms)  # created with the model's first lane
        if not self._store_holds_live_tickets:
            self._store.ticket_put(ticket)
        waited_ms = now_ms - ticket.enqueued_ms
        book = ticket.book
        assert book is not None, "set on admission"
        book.dispatched += 1
        self._count_dispatch(book.tallies, waited_ms, preempt, boosted)
        grants.append(Grant(ticket.request, backend.name, waited_ms, preempt, boosted and not preempt))
        return True

    @staticmethod
    def _count_dispatch(tallies: tuple[Tally, Tally], waited_ms: int, preempt: bool, boosted: bool) -> None:
        bucket = wait_bucket(waited_ms)
        for tally in tallies:
            tally.dispatched += 1
            tally.wait_hist[bucket] += 1
            if preempt:
                tally.preempted += 1
            elif boosted:
                tally.boosted += 1
