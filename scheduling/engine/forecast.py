"""Forecast of the top class's arrivals: a time-of-day profile blended with the recent rate.

The profile is an exponentially weighted average per time-of-day bucket over the days seen; the
recent rate decays with ``recent_ms``; the forecast is ``profile_weight`` of the one and the rest of
the other (the recent rate alone where the profile has no value). Its state is part of the engine,
so the shared dispatcher's snapshot carries it. Details and why: docs/engine.md, "The arrival
forecast".
"""

from __future__ import annotations

import math

DAY_MS = 86_400_000


class ArrivalForecast:
    __slots__ = ("bucket_ms", "alpha", "recent_ms", "profile", "bucket", "count", "counting_whole", "rate", "rate_ms")

    def __init__(self, *, bucket_ms: int, alpha: float, recent_ms: int) -> None:
        if bucket_ms <= 0 or DAY_MS % bucket_ms:
            raise ValueError(f"bucket_ms {bucket_ms} must divide a day")
        self.bucket_ms = bucket_ms
        self.alpha = alpha
        self.recent_ms = recent_ms
        self.profile: list[float | None] = [None] * (DAY_MS // bucket_ms)  # arrivals per bucket, over days
        self.bucket: int | None = None  # absolute number (now_ms // bucket_ms) of the bucket being counted
        self.count = 0  # arrivals counted in it
        self.counting_whole = False  # it was counted from its start (the first one after a start is not)
        self.rate = 0.0  # recent arrivals per ms, as of rate_ms
        self.rate_ms = 0

    def compatible(self, *, bucket_ms: int, alpha: float, recent_ms: int) -> bool:
        """Whether this forecast's learning applies under these settings (else start a new one)."""
        return (self.bucket_ms, self.alpha, self.recent_ms) == (bucket_ms, alpha, recent_ms)

    # ------------------------------------------------------------------ learning
    def observe(self, now_ms: int) -> None:
        """One arrival at ``now_ms`` (non-decreasing)."""
        self._roll(now_ms)
        self.count += 1
        self.rate = self.recent_rate(now_ms) + 1.0 / self.recent_ms
        self.rate_ms = now_ms

    def _roll(self, now_ms: int) -> None:
        index = now_ms // self.bucket_ms
        if self.bucket is None:
            self.bucket = index
            return
        if index <= self.bucket:
            return
        if self.counting_whole:
            self._learn(self.bucket, self.count)
        buckets = len(self.profile)
        for passed in range(max(self.bucket + 1, index - buckets), index):  # buckets without arrivals
            self._learn(passed, 0)
        self.bucket, self.count, self.counting_whole = index, 0, True

    def _learn(self, bucket: int, count: int) -> None:
        slot = bucket % len(self.profile)
        old = self.profile[slot]
        self.profile[slot] = float(count) if old is None else old + self.alpha * (count - old)

    # ------------------------------------------------------------------ forecasting
    def recent_rate(self, now_ms: int) -> float:
        """Arrivals per ms recently (decayed to ``now_ms``)."""
        if not self.rate:
            return 0.0
        return self.rate * math.exp(-max(0, now_ms - self.rate_ms) / self.recent_ms)

    def profile_rate(self, at_ms: float) -> float | None:
        """Arrivals per ms the profile expects at ``at_ms``; None where no day has been seen."""
        width = self.bucket_ms
        offset = at_ms - width / 2  # interpolate between bucket centres
        first = math.floor(offset / width)
        share = offset / width - first
        buckets = len(self.profile)
        low, high = self.profile[first % buckets], self.profile[(first + 1) % buckets]
        if low is None and high is None:
            return None
        if low is None or high is None:
            return (low if high is None else high) / width  # type: ignore[operator]
        return (low + share * (high - low)) / width

    def rate_per_ms(self, now_ms: int, horizon_ms: int, profile_weight: float) -> float:
        """The forecast arrival rate over ``(now_ms, now_ms + horizon_ms]`` (the profile read at its middle)."""
        recent = self.recent_rate(now_ms)
        profile = self.profile_rate(now_ms + horizon_ms / 2)
        if profile is None:
            return recent
        return profile_weight * profile + (1.0 - profile_weight) * recent

    def expected(self, now_ms: int, horizon_ms: int, profile_weight: float) -> float:
        """Arrivals expected within the next ``horizon_ms``."""
        return self.rate_per_ms(now_ms, horizon_ms, profile_weight) * horizon_ms
