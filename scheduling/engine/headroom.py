"""Predictive headroom: a freed slot stays free briefly when the top class is about to need it.

With ``headroom.enabled`` the engine forecasts the top class's arrivals (``forecast``) and keeps up
to the slots they need free (``need``, bounded by ``max_slots``, with ``miss_share`` by the pool's
turnover and with ``deadline_share`` by what the lower classes can spare, ``headroom_spare``)
instead of handing each freed slot to a lower class at once; a hold ends after ``hold_ms`` and is
never renewed. :class:`Headroom` is the engine's part for it; it owns its holds
and its forecast, both carried by the snapshot. The rules and why: docs/engine.md, "Headroom".
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Callable
from typing import Any

from .capacity import Capacity
from .forecast import ArrivalForecast
from .model import HeadroomPolicy


class Headroom:
    """The engine's part that holds slots for the top class: its policy, the arrival forecast, the
    holds and what they cost. The scheduler calls it on a top-class arrival, a freed slot, a
    dispatch round and each grant; its state outlives a reconfiguration that turns it off."""

    def __init__(self, capacity: Capacity, spare: Callable[[float, int], int] | None = None) -> None:
        self.capacity = capacity
        self.spare = spare  # (deadline_share, now_ms) -> slots the lower classes can spare (``headroom_spare``)
        self.policy = HeadroomPolicy()
        self.on = False
        self.hold_idle = False  # also hold free slots that did not just free
        self.forecast: ArrivalForecast | None = None  # None: headroom off
        self.holds: list[int] = []  # hold ends, ascending
        self.held_slot_ms = 0  # slot-ms left idle by holds so far (what headroom cost the lower classes)
        self.released_ms = -1  # the instant of the last hold that ended or was released (not used)
        self.released = 0  # how many ended or were released at that instant
        self.slot_free_rate = 0.0  # recent slot frees per ms, as of slot_free_rate_ms (``miss_share``'s turnover)
        self.slot_free_rate_ms = 0

    def apply(self, policy: HeadroomPolicy, *, single_queue: bool) -> None:
        """A new configuration: the forecast is kept while its settings are the same."""
        self.policy = policy
        self.on = policy.enabled and not single_queue
        self.hold_idle = self.on and policy.hold_idle
        bucket_ms, alpha, recent_ms = policy.bucket_ms, policy.profile_alpha, policy.recent_ms
        forecast = self.forecast
        if not self.on:
            self.forecast, self.holds = None, []
        elif forecast is None or not forecast.compatible(bucket_ms=bucket_ms, alpha=alpha, recent_ms=recent_ms):
            self.forecast = ArrivalForecast(bucket_ms=bucket_ms, alpha=alpha, recent_ms=recent_ms)

    def need(self, now_ms: int) -> int:
        """Slots the forecast wants free for the top class at ``now_ms`` (0: headroom off or no need)."""
        forecast = self.forecast
        if forecast is None:
            return 0
        policy = self.policy
        spare = policy.max_slots  # read first: 0 (a lower class short) is common and ends it
        if policy.deadline_share > 0 and self.spare is not None:
            spare = min(spare, self.spare(policy.deadline_share, now_ms))
            if not spare:
                return 0
        expected = forecast.expected(now_ms, policy.horizon_ms, policy.profile_weight)
        if expected < policy.min_expected:
            return 0
        need = min(spare, math.ceil(expected))
        if policy.miss_share > 0:
            bound = turnover_bound(self.free_rate(now_ms) * policy.horizon_ms / expected, policy.miss_share)
            need = need if bound is None else min(need, bound)
        return need

    def free_rate(self, now_ms: int) -> float:
        """Slots freed per ms recently (decayed to ``now_ms`` with the forecast's ``recent_ms``)."""
        if not self.slot_free_rate:
            return 0.0
        return self.slot_free_rate * math.exp(-max(0, now_ms - self.slot_free_rate_ms) / self.policy.recent_ms)

    def top_arrival(self, now_ms: int) -> None:
        forecast = self.forecast
        if forecast is not None:
            forecast.observe(now_ms)

    def slot_freed(self, now_ms: int, lower_waiting: Callable[[], bool]) -> None:
        """A running request left its slot at ``now_ms``: hold the slot if the need is not met
        (``lower_waiting``: whether a request of a class below the top waits)."""
        if self.forecast is None:
            return
        self.slot_free_rate = self.free_rate(now_ms) + 1.0 / self.policy.recent_ms
        self.slot_free_rate_ms = now_ms
        holds = self.holds
        while holds and holds[0] <= now_ms:
            self._release(holds.pop(0), now_ms)
        if lower_waiting() and len(holds) < self.need(now_ms):
            insort(holds, now_ms + self.policy.hold_ms)

    def refresh(self, now_ms: int) -> None:
        """Before a dispatch round: drop ended holds, release those beyond the need or the free slots."""
        holds = self.holds
        while holds and holds[0] <= now_ms:
            self._release(holds.pop(0), now_ms)
        if holds:
            capacity = self.capacity
            keep = min(self.need(now_ms), capacity.total_slots)
            free = sum(max(0, s.slots - s.busy) for s in capacity.states.values() if s.enabled)
            excess = len(holds) - min(keep, free)
            for _ in range(max(0, excess)):
                self._release(holds.pop(0), now_ms)

    def held_back(self, model: str, now_ms: int) -> bool:
        """Whether a lower-class request of ``model`` must leave the free slots to the holds."""
        return self.capacity.free_slots(model, now_ms) <= len(self.holds)

    def hold_idle_slot(self, model: str, now_ms: int) -> None:
        """``hold_idle``: a lower-class request of ``model`` is about to take a free slot; hold one more
        if fewer are held than the need and a free slot is left that no hold just left."""
        holds = self.holds
        released = self.released if self.released_ms == now_ms else 0
        if self.capacity.free_slots(model, now_ms) - len(holds) - released <= 0:
            return
        if len(holds) < self.need(now_ms):
            insort(holds, now_ms + self.policy.hold_ms)

    def used(self, model: str, now_ms: int) -> None:
        """A top-class request took a slot: it used a hold if fewer slots than holds are free now."""
        holds = self.holds
        if holds and self.capacity.free_slots(model, now_ms) < len(holds):
            self._end(holds.pop(0), now_ms)

    def _release(self, end_ms: int, now_ms: int) -> None:
        """A hold ended or was released (not used): its slot goes to the dispatch order, not to a new hold."""
        if self.released_ms != now_ms:
            self.released_ms, self.released = now_ms, 0
        self.released += 1
        self._end(end_ms, now_ms)

    def _end(self, end_ms: int, now_ms: int) -> None:
        """A hold is over (ended, released or used): count the time its slot stood idle."""
        self.held_slot_ms += max(0, min(end_ms, now_ms) - (end_ms - self.policy.hold_ms))

    def as_record(self) -> dict[str, Any]:
        """The state beside the policy, as plain data (the engine's snapshot)."""
        forecast = self.forecast
        return {
            "holds": list(self.holds),
            "held_slot_ms": self.held_slot_ms,
            "released": [self.released_ms, self.released],
            "slot_free_rate": [self.slot_free_rate, self.slot_free_rate_ms],
            "forecast": None if forecast is None else forecast.as_state(),
        }

    def restore(self, record: dict[str, Any]) -> None:
        """Takes the state of ``record`` (from `as_record`); the policy is applied already."""
        self.holds = list(record["holds"])
        self.held_slot_ms = record["held_slot_ms"]
        self.released_ms, self.released = record["released"]
        self.slot_free_rate, self.slot_free_rate_ms = record["slot_free_rate"]
        if record["forecast"] is not None:
            policy = self.policy
            forecast = ArrivalForecast(
                bucket_ms=policy.bucket_ms, alpha=policy.profile_alpha, recent_ms=policy.recent_ms
            )
            forecast.restore(record["forecast"])
            self.forecast = forecast


def turnover_bound(turnover: float, miss_share: float) -> int | None:
    """The fewest holds (at least 1) with which a top-class arrival finds none held at most
    ``miss_share`` of the time, when slots free ``turnover`` times as fast as it arrives (``a`` in
    the module's docstring); None (no bound) when they free no faster than it arrives."""
    if turnover <= 1.0:
        return None
    held = math.log1p((turnover - 1.0) / miss_share) / math.log(turnover) - 1.0
    return max(1, math.ceil(held - 1e-9))
