"""Predictive headroom: a freed slot stays free briefly when the top class is about to need it.

With ``headroom.enabled``, the engine forecasts the top class's arrivals (``forecast``: a
time-of-day profile blended with the recent rate; every request submitted to a class of the top
level counts, admitted or not) and keeps a few slots free for them instead of handing each freed
slot to a lower class at once:

* **need**: ``ceil(E)`` slots, at most ``max_slots``, where ``E`` is the number of top-class
  arrivals expected within ``horizon_ms``; 0 while ``E < min_expected``.
* **turnover** (``miss_share`` > 0): the need is also bounded by what the pool's turnover asks.
  Held slots are a stock that top-class arrivals (rate ``λ``, the forecast's) draw down and freed
  slots (rate ``f``, measured like the recent arrival rate: every slot that frees counts) fill up
  again; as a birth-death chain, an arrival finds none held with probability
  ``(a - 1) / (a^(B+1) - 1)`` for ``B`` held and ``a = f / λ``. The bound is the smallest ``B``
  (at least 1) that keeps it within ``miss_share``. A pool that turns over fast refills a few
  holds before the next arrivals come, so it holds fewer than a slow one (a long service, a
  small pool), and the slot-time given up shrinks where holding more buys nothing; while
  ``f <= λ`` there is no bound. Nothing of this measures the future: ``f`` is the recent past.
* **hold**: when a slot frees (a completion, a failure, an upstream 429) while a lower class has
  requests waiting and fewer slots are held than the need, that slot is held until
  ``now + hold_ms``. A hold is never renewed: when it ends
  its slot goes to whoever the dispatch order picks, and only a later freed slot may be held.
  So a slot idles at most ``hold_ms`` per hold, and the slot-time given up is at most
  ``hold_ms`` per freed slot.
* **dispatch**: first the holds that ended are dropped and those beyond the need at ``now`` (the
  soonest ending first) or beyond the free slots are released; then a request of a lower class
  (any level below the top, outside the preempt stage) takes a slot only while more slots of its
  model are free than are held. A top-class request takes any free slot, held ones included (it
  uses up the hold that ends first). A request at preempt (aging's last stage) is owed service
  now and is not held back.
* **idle slots** (``hold_idle``): a slot can also be held without having just freed. When a
  lower-class request would take a free slot while fewer slots are held than the need, and more
  slots are free than are held plus those whose hold ended at this very instant, one more slot is
  held instead (then the request takes a free slot if one is left beyond the holds). So a pool that
  was idle and that a BATCH burst fills at once keeps its headroom, and a hold is still never
  renewed: the slots whose holds just ended go to the dispatch order. Off by default (then holds
  start only when a slot frees).
* **wake-up**: ``next_wakeup_ms`` includes the earliest hold end while requests wait, so a driver
  that follows it (the simulator, the embedded and the shared dispatchers) grants a held slot at
  its hold's end, never later.

Holds count slots pooled across backends and models (as the depth limit's capacity does); with
several models a hold blocks lower classes of each model until that model has more free slots
than holds. The holds are a few integers in the engine; like the forecast they are rebuilt by a
standby from the snapshot and the replayed steps.
"""

from __future__ import annotations

import math
from bisect import insort

from .capacity import Capacity
from .class_plans import ClassPlan
from .forecast import ArrivalForecast
from .model import HeadroomPolicy


class HeadroomMixin:
    """Needs ``_capacity`` and calls ``_apply_headroom`` from the scheduler's configuration."""

    _capacity: Capacity
    _plans: dict[str, ClassPlan]
    _depth_by_cls: dict[str, int]
    _headroom: HeadroomPolicy
    _headroom_on: bool
    _forecast: ArrivalForecast | None
    _holds: list[int]  # hold ends, ascending
    _hold_idle_on: bool
    _released_ms: int  # the instant of the last hold that ended or was released (not used)
    _released: int  # how many ended or were released at that instant
    held_slot_ms: int  # slot-ms left idle by holds so far (what headroom cost the lower classes)
    _free_rate: float  # recent slot frees per ms, as of _free_rate_ms (``miss_share``'s turnover)
    _free_rate_ms: int

    def _apply_headroom(self, policy: HeadroomPolicy, *, single_queue: bool) -> None:
        self._headroom = policy
        self.held_slot_ms = getattr(self, "held_slot_ms", 0)
        self._headroom_on = policy.enabled and not single_queue
        self._hold_idle_on = self._headroom_on and policy.hold_idle
        self._released_ms, self._released = getattr(self, "_released_ms", -1), getattr(self, "_released", 0)
        self._free_rate, self._free_rate_ms = getattr(self, "_free_rate", 0.0), getattr(self, "_free_rate_ms", 0)
        bucket_ms, alpha, recent_ms = policy.bucket_ms, policy.profile_alpha, policy.recent_ms
        forecast = getattr(self, "_forecast", None)
        if not self._headroom_on:
            self._forecast, self._holds = None, []
        elif forecast is None or not forecast.compatible(bucket_ms=bucket_ms, alpha=alpha, recent_ms=recent_ms):
            self._forecast = ArrivalForecast(bucket_ms=bucket_ms, alpha=alpha, recent_ms=recent_ms)
            self._holds = getattr(self, "_holds", [])

    def headroom_need(self, *, now_ms: int) -> int:
        """Slots the forecast wants free for the top class at ``now_ms`` (0: headroom off or no need)."""
        forecast = self._forecast
        if forecast is None:
            return 0
        policy = self._headroom
        expected = forecast.expected(now_ms, policy.horizon_ms, policy.profile_weight)
        if expected < policy.min_expected:
            return 0
        need = min(policy.max_slots, math.ceil(expected))
        if policy.miss_share > 0:
            bound = turnover_bound(self.free_rate(now_ms) * policy.horizon_ms / expected, policy.miss_share)
            need = need if bound is None else min(need, bound)
        return need

    def free_rate(self, now_ms: int) -> float:
        """Slots freed per ms recently (decayed to ``now_ms`` with the forecast's ``recent_ms``)."""
        if not self._free_rate:
            return 0.0
        return self._free_rate * math.exp(-max(0, now_ms - self._free_rate_ms) / self._headroom.recent_ms)

    def headroom_holds(self) -> tuple[int, ...]:
        """The ends of the current holds (ms, ascending)."""
        return tuple(self._holds)

    def _top_arrival(self, now_ms: int) -> None:
        forecast = self._forecast
        if forecast is not None:
            forecast.observe(now_ms)

    def _slot_freed(self, now_ms: int) -> None:
        """A running request left its slot at ``now_ms``: hold the slot if the need is not met."""
        if self._forecast is None:
            return
        self._free_rate = self.free_rate(now_ms) + 1.0 / self._headroom.recent_ms
        self._free_rate_ms = now_ms
        holds = self._holds
        while holds and holds[0] <= now_ms:
            self._hold_release(holds.pop(0), now_ms)
        if self._lower_waiting() and len(holds) < self.headroom_need(now_ms=now_ms):
            insort(holds, now_ms + self._headroom.hold_ms)

    def _lower_waiting(self) -> bool:
        """Whether a request of a class below the top waits (else a free slot stays free anyway)."""
        plans = self._plans
        return any(depth and not plans[cls].privileged for cls, depth in self._depth_by_cls.items())

    def _refresh_holds(self, now_ms: int) -> None:
        """Before a dispatch round: drop ended holds, release those beyond the need or the free slots."""
        holds = self._holds
        while holds and holds[0] <= now_ms:
            self._hold_release(holds.pop(0), now_ms)
        if holds:
            capacity = self._capacity
            keep = min(self.headroom_need(now_ms=now_ms), capacity.total_slots)
            free = sum(max(0, s.slots - s.busy) for s in capacity.states.values() if s.enabled)
            excess = len(holds) - min(keep, free)
            for _ in range(max(0, excess)):
                self._hold_release(holds.pop(0), now_ms)

    def _held_back(self, model: str, now_ms: int) -> bool:
        """Whether a lower-class request of ``model`` must leave the free slots to the holds."""
        return self._capacity.free_slots(model, now_ms) <= len(self._holds)

    def _hold_idle_slot(self, model: str, now_ms: int) -> None:
        """``hold_idle``: a lower-class request of ``model`` is about to take a free slot; hold one more
        if fewer are held than the need and a free slot is left that no hold just left."""
        holds = self._holds
        released = self._released if self._released_ms == now_ms else 0
        if self._capacity.free_slots(model, now_ms) - len(holds) - released <= 0:
            return
        if len(holds) < self.headroom_need(now_ms=now_ms):
            insort(holds, now_ms + self._headroom.hold_ms)

    def _hold_used(self, model: str, now_ms: int) -> None:
        """A top-class request took a slot: it used a hold if fewer slots than holds are free now."""
        holds = self._holds
        if holds and self._capacity.free_slots(model, now_ms) < len(holds):
            self._hold_end(holds.pop(0), now_ms)

    def _hold_release(self, end_ms: int, now_ms: int) -> None:
        """A hold ended or was released (not used): its slot goes to the dispatch order, not to a new hold."""
        if self._released_ms != now_ms:
            self._released_ms, self._released = now_ms, 0
        self._released += 1
        self._hold_end(end_ms, now_ms)

    def _hold_end(self, end_ms: int, now_ms: int) -> None:
        """A hold is over (ended, released or used): count the time its slot stood idle."""
        self.held_slot_ms += max(0, min(end_ms, now_ms) - (end_ms - self._headroom.hold_ms))


def turnover_bound(turnover: float, miss_share: float) -> int | None:
    """The fewest holds (at least 1) with which a top-class arrival finds none held at most
    ``miss_share`` of the time, when slots free ``turnover`` times as fast as it arrives (``a`` in
    the module's docstring); None (no bound) when they free no faster than it arrives."""
    if turnover <= 1.0:
        return None
    held = math.log1p((turnover - 1.0) / miss_share) / math.log(turnover) - 1.0
    return max(1, math.ceil(held - 1e-9))
