"""The depth rule's arithmetic, and the rate windows and service means admission and prediction read.

Depth limit of a class: ``clamp(throughput_60s x sla_s, floor, depth_cap)``, the floor being what the
free slots could serve within the SLA; each tenant keeps room for its weighted share of it; a
refusal's retry-after is the time to drain the excess. :class:`RateWindow` counts events over the
last window, :class:`ServiceMean` keeps a class's mean service time and its dispersion. The rule
(``admission_rules.DepthAdmission``) and why it is so: docs/engine.md, "Admission by the depth limit".
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

WINDOW_MS = 60_000
RATE_ENTRY_MS = 250  # a RateWindow's resolution: events this close to an entry's first one share it
EWMA_ALPHA = 0.05
DISPERSION_SAMPLES = 40  # completions before a class's measured dispersion replaces the Poisson assumption


class RateWindow:
    """Event counts over the last 60 s, in entries of at most ``RATE_ENTRY_MS`` each (amortised O(1)).

    An event that comes less than ``RATE_ENTRY_MS`` after the first event of the newest entry is
    counted in that entry; an entry leaves the window when its first event does, taking the later
    ones with it. So the window holds at most ``WINDOW_MS / RATE_ENTRY_MS + 1`` entries whatever
    the rate (the shared dispatcher's snapshot carries it: one entry per event made it grow with
    the rate, to millions of ints at tens of thousands of dispatches a second), and it counts
    exactly the events of the last 60 s except those that share an entry with an older one that
    has left: up to ``RATE_ENTRY_MS`` of events, 1/240 of the window at a steady rate. It never
    counts more than the exact count: the depth limit and the drain rate it gives are never
    higher (admission stays conservative). Events at one instant, or ``RATE_ENTRY_MS`` or more
    apart, are counted exactly. Old entries are dropped when one is added as well as when counted,
    so a window nobody reads stays within its bound too."""

    __slots__ = ("times", "counts", "total")

    def __init__(self) -> None:
        self.times: deque[int] = deque()  # each entry's first event, ascending
        self.counts: deque[int] = deque()  # each entry's events
        self.total = 0

    def as_record(self) -> list[object]:
        """Plain data (a snapshot's): the entries' times, their counts, the total."""
        return [list(self.times), list(self.counts), self.total]

    @classmethod
    def from_record(cls, record: list[Any]) -> RateWindow:
        window = cls()
        window.times, window.counts, window.total = deque(record[0]), deque(record[1]), record[2]
        return window

    def add(self, now_ms: int, amount: int = 1) -> None:
        """One event (``amount``: a weight, such as a completion's tokens; the window then sums them)."""
        times = self.times
        if times and now_ms - times[-1] < RATE_ENTRY_MS:
            self.counts[-1] += amount
        else:
            self._drop(now_ms)
            times.append(now_ms)
            self.counts.append(amount)
        self.total += amount

    def count(self, now_ms: int) -> int:
        self._drop(now_ms)
        return self.total

    def _drop(self, now_ms: int) -> None:
        times = self.times
        horizon = now_ms - WINDOW_MS
        while times and times[0] <= horizon:
            times.popleft()
            self.total -= self.counts.popleft()


class ServiceMean:
    __slots__ = ("mean_ms", "samples", "var_ms2")

    def __init__(self) -> None:
        self.mean_ms = 0.0
        self.samples = 0
        self.var_ms2 = 0.0  # exponentially weighted variance, with the same weights as the mean

    def add(self, service_ms: int) -> None:
        self.samples += 1
        if self.samples == 1:
            self.mean_ms = float(service_ms)
        else:
            diff = service_ms - self.mean_ms
            step = EWMA_ALPHA * diff
            self.mean_ms += step
            self.var_ms2 = (1 - EWMA_ALPHA) * (self.var_ms2 + diff * step)

    def dispersion(self) -> float:
        """The squared coefficient of variation once :data:`DISPERSION_SAMPLES` have completed, else 1
        (what a Poisson count of turnovers assumes: exponential service times)."""
        if self.samples < DISPERSION_SAMPLES or self.mean_ms <= 0:
            return 1.0
        return min(1.0, self.var_ms2 / (self.mean_ms * self.mean_ms))

    def value(self, prior_ms: int) -> float:
        return max(self.mean_ms if self.samples else float(prior_ms), 1.0)


def rate_window(table: dict[str, RateWindow], key: str) -> RateWindow:
    """``table[key]``, created empty on first use."""
    window = table.get(key)
    if window is None:
        window = table[key] = RateWindow()
    return window


def service_mean(table: dict[str, ServiceMean], key: str) -> ServiceMean:
    """``table[key]``, created without samples on first use."""
    mean = table.get(key)
    if mean is None:
        mean = table[key] = ServiceMean()
    return mean


def floor_depth(free_slots: int, sla_ms: int, mean_service_ms: float) -> int:
    return int(max(free_slots, 0) * sla_ms // mean_service_ms)


def depth_limit(dispatched_60s: int, sla_ms: int, floor: int, cap: int) -> int:
    by_rate = dispatched_60s * sla_ms // WINDOW_MS
    return max(1, min(max(by_rate, floor), cap))


def tenant_room(weight: float, limit: int) -> int:
    return max(1, int(weight * limit))


def admits(class_depth: int, tenant_depth: int, limit: int, room: int) -> bool:
    if class_depth < limit:
        return True
    return tenant_depth < room and class_depth < 2 * limit


def retry_after_ms(excess: int, drain_per_ms: float, sla_ms: int) -> int:
    if drain_per_ms <= 0:
        return max(1, sla_ms)
    return max(1, min(sla_ms, math.ceil(max(excess, 1) / drain_per_ms)))


def turnovers_at_least(count: int, mean: float, dispersion: float) -> float:
    """``P(N >= count)`` for a count of turnovers with ``mean`` and variance ``mean x dispersion`` (a
    renewal count: many slots, service times of that squared coefficient of variation); Poisson at
    dispersion 1, else normal (continuity-corrected)."""
    if dispersion >= 1.0 or count <= 0 or mean <= 0:
        return poisson_at_least(count, mean)
    return 0.5 * math.erfc((count - 0.5 - mean) / math.sqrt(2 * mean * max(dispersion, 1e-6)))


def count_at_least(count: int, mean: float, variance: float) -> float:
    """``P(N >= count)`` for a count with ``mean`` and ``variance``, normal (continuity-corrected)."""
    if count <= 0:
        return 1.0
    if variance <= 0:
        return 1.0 if mean >= count else 0.0
    return 0.5 * math.erfc((count - 0.5 - mean) / math.sqrt(2 * variance))


def poisson_at_least(count: int, mean: float) -> float:
    """``P(N >= count)`` for ``N`` Poisson with ``mean`` (exact sum; normal beyond 500 terms)."""
    if count <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if count > 500:
        return 0.5 * math.erfc((count - 0.5 - mean) / math.sqrt(2 * mean))
    term = below = math.exp(-mean)
    for k in range(1, count):
        term *= mean / k
        below += term
    return max(0.0, 1.0 - below)
