"""The dispatch order: which waiting request gets a free slot, and the preempt and rescue heaps.

A round at ``now_ms`` fills every slot it can: first the preempt stage (requests whose wait ratio
reached the preempt bound, their lanes earliest deadline first), then the lane of smallest
``level - boost``, each lane serving its fair-share pick (``fairness``) or, with the deadline
rescue, its request closest to its deadline. :class:`DispatchOrder` is a part of the engine over its
lanes and heaps. The order and why it is so: docs/engine.md, "Dispatch order".
"""

from __future__ import annotations

import math
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Never, TypeAlias

from .counters import Tally, wait_bucket
from .fairness import Lane, Rank
from .outcomes import Grant
from .queues import unqueue
from .store import RUNNING, WAITING, Ticket

if TYPE_CHECKING:
    from .scheduler import Scheduler

# A preempt-heap entry: (deadline ms, level, enqueued_ms, id, ticket).
PreemptEntry: TypeAlias = tuple[int, int, int, str, Ticket]
# A rescue-heap entry (one heap per lane): (deadline ms, enqueued_ms, id, ticket).
RescueEntry: TypeAlias = tuple[int, int, str, Ticket]
RESCUE_SLACK = 1024  # stale rescue-heap entries tolerated beyond twice a lane's waiting requests

_NO_RANK: Rank = (float("inf"),)
_NOTHING_BLOCKED: frozenset[Never] = frozenset()  # empty, so it stands for no models and for no lanes


class DispatchOrder:
    """The engine's dispatch order: ``dispatch`` (a round), and what the engine's queue keeping calls
    (``promote``, ``rank``, ``oldest``, ``rescue_push``, ``rescue_compact``)."""

    def __init__(self, engine: Scheduler) -> None:
        self.engine = engine

    def dispatch(self, *, now_ms: int) -> list[Grant]:
        grants: list[Grant] = []
        capacity = self.engine._capacity
        headroom = self.engine.headroom
        if headroom.holds:  # ended holds go, those beyond the need or the free slots go (``headroom``)
            headroom.refresh(now_ms)
        if not self.engine._waiting or not capacity.any_free(now_ms):
            return grants
        if self.engine._aging.preempt_ratio is not None and self.engine._promote_due_ms <= now_ms:
            self.promote(now_ms)
        # Lanes and models that cannot be placed this round; sets only once something blocks.
        blocked_models: set[str] | frozenset[str] = _NOTHING_BLOCKED
        blocked_lanes: set[Lane] | frozenset[Lane] = _NOTHING_BLOCKED
        while True:
            ticket = self._preempt_top(blocked_models) if self.engine._promoted else None
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
            if not self.engine._waiting or not capacity.any_free(now_ms):
                break
        return grants

    def _pick(self, lane: Lane, now_ms: int) -> tuple[Ticket | None, bool]:
        """The lane's next request and whether the rescue chose it: its earliest deadline when that is
        within ``rescue_ms`` of ``now_ms``, else its fair-share pick."""
        if self.engine._rescue_ms:
            heap = self.engine._rescue.get(lane.key)
            while heap:
                deadline_ms, _, _, ticket = heap[0]
                if ticket.state == WAITING and ticket.lane is lane:
                    if deadline_ms - now_ms <= self.engine._rescue_ms:
                        return ticket, True
                    break
                heappop(heap)
        return lane.peek(), False

    def rescue_push(self, lane: Lane, ticket: Ticket, deadline_ms: int) -> None:
        heap = self.engine._rescue.get(lane.key)
        if heap is None:
            heap = self.engine._rescue[lane.key] = []
        heappush(heap, (deadline_ms, ticket.enqueued_ms, ticket.id, ticket))

    def rescue_compact(self, lane: Lane) -> None:
        """Drop the lane's rescue entries of requests that left it, once they outnumber the waiting
        ones by far (only the top is checked lazily). The live entries keep their total order."""
        heap = self.engine._rescue.get(lane.key)
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

    def promote(self, now_ms: int) -> None:
        """Move every request at or past the preempt bound into its model's preempt heap.

        Also sets ``_promote_due_ms`` to the earliest preempt time still ahead (the smallest live
        age-heap top); ``queues.enqueue`` lowers it. Until then no request can reach preempt, so
        dispatch skips this scan of every lane.
        """
        due_ms = float("inf")
        for lane in self.engine._lane_list:
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
                self.engine._promoted += 1
                heappush(self._preempt_heap(ticket.model), self._preempt_key(ticket))
        self.engine._promote_due_ms = due_ms

    def _preempt_key(self, ticket: Ticket) -> PreemptEntry:
        plan = self.engine._plans[ticket.cls]
        deadline = plan.deadline_ms(ticket.enqueued_ms, ticket.request.deadline_ms)
        return (deadline, plan.level, ticket.enqueued_ms, ticket.id, ticket)

    def _preempt_heap(self, model: str) -> list[PreemptEntry]:
        heap = self.engine._preempt.get(model)
        if heap is None:
            heap = self.engine._preempt[model] = []
        return heap

    def _preempt_top(self, blocked_models: set[str] | frozenset[str]) -> Ticket | None:
        best: PreemptEntry | None = None
        for model, heap in self.engine._preempt.items():
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

    def oldest(self, lane: Lane) -> Ticket | None:
        """The lane's oldest waiting request not yet in the preempt stage (lazy heap top)."""
        age = lane.age
        while age:
            ticket = age[0][2]
            if ticket.state == WAITING and ticket.lane is lane and not ticket.promoted:
                return ticket
            heappop(age)
        return None

    def rank(self, lane: Lane, now_ms: int) -> Rank:
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
        oldest = self.oldest(lane)  # drops entries of requests that left
        if oldest is None:
            return _NO_RANK
        lane.rank, lane.rank_valid_ms = self._fresh_rank(lane, oldest, now_ms)
        lane.rank_entry = age[0]
        return lane.rank

    def _fresh_rank(self, lane: Lane, oldest: Ticket, now_ms: int) -> tuple[Rank, tuple[float, float]]:
        """The rank of ``lane`` whose oldest request is ``oldest``, and the ms range it holds for."""
        level = lane.level
        if not self.engine._lanes_age:
            return (level, level, oldest.enqueued_ms, oldest.id), (-math.inf, math.inf)
        aging = self.engine._aging
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
        for lane in self.engine._lane_list:
            if lane.live <= lane.promoted or lane in blocked:
                continue
            rank = self.rank(lane, now_ms)
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
        plan = self.engine._plans[ticket.cls]
        capacity = self.engine._capacity
        headroom = self.engine.headroom
        if headroom.hold_idle and not preempt and not plan.privileged:
            headroom.hold_idle_slot(ticket.model, now_ms)  # an idle slot may become a hold first (``headroom``)
        if headroom.holds and not preempt and not plan.privileged and headroom.held_back(ticket.model, now_ms):
            return False  # the free slots are held for the top class's forecast arrivals
        backend = capacity.place(ticket.model, ticket.vip or plan.privileged, ticket.vip, ticket.est_tokens, now_ms)
        if backend is None:
            return False
        lane, tq = ticket.lane, ticket.tq
        assert lane is not None and tq is not None, "a waiting ticket is in a lane and a tenant queue"
        unqueue(self.engine, ticket)
        lane.charge(ticket, tq, not preempt and not rescued)  # only the fair pick moves the lane's virtual time
        if rescued:
            self.engine.rescued += 1
        ticket.state = RUNNING
        ticket.backend = backend.name
        ticket.dispatched_ms = now_ms
        ticket.window_handle = capacity.occupy(backend, ticket.est_tokens, now_ms)
        self.engine._running_by_cls[ticket.cls] = self.engine._running_by_cls.get(ticket.cls, 0) + 1
        self.engine._started_sum[ticket.cls] = self.engine._started_sum.get(ticket.cls, 0) + now_ms
        if headroom.holds and plan.privileged:
            headroom.used(ticket.model, now_ms)
        plan.dispatch_rate.add(now_ms)
        self.engine._model_rate[ticket.model].add(now_ms)  # created with the model's first lane
        if not self.engine._store_holds_live_tickets:
            self.engine._store.ticket_put(ticket)
        if ticket.eta_first is not None:  # someone was given its ETA: it calibrates the next ones (``eta``)
            self.engine.eta_book.started(ticket, now_ms)
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
