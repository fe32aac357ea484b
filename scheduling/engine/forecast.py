"""Arrival forecasts: the top class's (a time-of-day profile blended with the recent rate, for
headroom) and every (class, tenant)'s time-of-day profile (``DemandProfile``, for prediction).

Both learn through one ``DayProfiles``: per key, an exponentially weighted average per time-of-day
bucket over the days seen. The recent rate decays with ``recent_ms``; the forecast is
``profile_weight`` of the one and the rest of the other (the recent rate alone where the profile has
no value). Their state is part of the engine, so the shared dispatcher's snapshot carries it.
Details and why: docs/engine.md, "The arrival forecast" and "Foreseen demand".
"""

from __future__ import annotations

import math
from typing import Any

DAY_MS = 86_400_000
TOTAL = ""  # ArrivalForecast's one key


class DayProfiles:
    """Arrivals per key and time-of-day bucket, averaged over the days seen. Every key learns when
    the bucket being counted ends (a key without arrivals in it learns 0; a key is made at its
    first learned arrival, or by `add_key`); the first bucket after a start is not learned."""

    __slots__ = ("bucket_ms", "alpha", "profiles", "covered", "bucket", "counts", "counting_whole")

    def __init__(self, *, bucket_ms: int, alpha: float) -> None:
        if bucket_ms <= 0 or DAY_MS % bucket_ms:
            raise ValueError(f"bucket_ms {bucket_ms} must divide a day")
        self.bucket_ms = bucket_ms
        self.alpha = alpha
        self.profiles: dict[Any, list[float | None]] = {}  # arrivals per bucket, over days
        self.covered = [False] * (DAY_MS // bucket_ms)  # some day was counted whole in the bucket
        self.bucket: int | None = None  # absolute number (now_ms // bucket_ms) of the bucket being counted
        self.counts: dict[Any, int] = {}  # arrivals counted in it, by key
        self.counting_whole = False  # it was counted from its start

    def add_key(self, key: Any) -> list[float | None]:
        profile = self.profiles[key] = [None] * len(self.covered)
        return profile

    def roll(self, now_ms: int) -> None:
        """Time is ``now_ms``: a bucket that ended is learned (an earlier time starts a partial one)."""
        index = now_ms // self.bucket_ms
        if index == self.bucket:
            return
        if self.bucket is None or index < self.bucket:
            self.bucket, self.counting_whole = index, False
            return
        if self.counting_whole:
            self._learn(self.bucket, self.counts)
        for passed in range(max(self.bucket + 1, index - len(self.covered)), index):  # buckets without arrivals
            self._learn(passed, {})
        self.bucket, self.counts, self.counting_whole = index, {}, True

    def _learn(self, bucket: int, counts: dict[Any, int]) -> None:
        slot = bucket % len(self.covered)
        self.covered[slot] = True
        for key in [key for key in counts if key not in self.profiles]:
            self.add_key(key)
        alpha = self.alpha
        for key, profile in self.profiles.items():
            count, old = counts.get(key, 0), profile[slot]
            profile[slot] = float(count) if old is None else old + alpha * (count - old)


class ArrivalForecast:
    """One key's profile (``DayProfiles``) and its recent rate: what headroom plans on."""

    __slots__ = ("days", "recent_ms", "rate", "rate_ms")

    def __init__(self, *, bucket_ms: int, alpha: float, recent_ms: int) -> None:
        self.days = DayProfiles(bucket_ms=bucket_ms, alpha=alpha)
        self.days.add_key(TOTAL)
        self.recent_ms = recent_ms
        self.rate = 0.0  # recent arrivals per ms, as of rate_ms
        self.rate_ms = 0

    @property
    def bucket_ms(self) -> int:
        return self.days.bucket_ms

    @property
    def profile(self) -> list[float | None]:
        """Arrivals per bucket, over days."""
        return self.days.profiles[TOTAL]

    def compatible(self, *, bucket_ms: int, alpha: float, recent_ms: int) -> bool:
        """Whether this forecast's learning applies under these settings (else start a new one)."""
        return (self.days.bucket_ms, self.days.alpha, self.recent_ms) == (bucket_ms, alpha, recent_ms)

    # ------------------------------------------------------------------ learning
    def observe(self, now_ms: int) -> None:
        """One arrival at ``now_ms`` (non-decreasing)."""
        days = self.days
        if now_ms // days.bucket_ms != days.bucket:
            days.roll(now_ms)
        counts = days.counts
        counts[TOTAL] = counts.get(TOTAL, 0) + 1
        self.rate = self.recent_rate(now_ms) + 1.0 / self.recent_ms
        self.rate_ms = now_ms

    def as_state(self) -> list[Any]:
        """What it learned, as plain data: profile, bucket, count, counting_whole, rate, rate_ms."""
        days = self.days
        return [self.profile, days.bucket, days.counts.get(TOTAL, 0), days.counting_whole, self.rate, self.rate_ms]

    def restore(self, state: list[Any]) -> None:
        """Takes what `as_state` gave."""
        profile, bucket, count, counting_whole, self.rate, self.rate_ms = state
        days = self.days
        days.profiles[TOTAL] = list(profile)
        days.bucket, days.counting_whole = bucket, counting_whole
        days.counts = {TOTAL: count} if count else {}

    # ------------------------------------------------------------------ forecasting
    def recent_rate(self, now_ms: int) -> float:
        """Arrivals per ms recently (decayed to ``now_ms``)."""
        if not self.rate:
            return 0.0
        return self.rate * math.exp(-max(0, now_ms - self.rate_ms) / self.recent_ms)

    def profile_rate(self, at_ms: float) -> float | None:
        """Arrivals per ms the profile expects at ``at_ms``; None where no day has been seen."""
        width = self.days.bucket_ms
        offset = at_ms - width / 2  # interpolate between bucket centres
        first = math.floor(offset / width)
        share = offset / width - first
        profile = self.profile
        buckets = len(profile)
        low, high = profile[first % buckets], profile[(first + 1) % buckets]
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


class DemandProfile(DayProfiles):
    """Arrivals per (class, tenant) and time-of-day bucket, averaged over the days seen, for
    predicted admission (docs/engine.md, "Foreseen demand"). The key ``(class, "")`` is the class's
    total. Unlike ``ArrivalForecast``'s one key, a key is made at its first learned arrival."""

    __slots__ = ("tenants",)

    def __init__(self, *, bucket_ms: int, alpha: float) -> None:
        super().__init__(bucket_ms=bucket_ms, alpha=alpha)
        self.tenants: dict[str, list[str]] = {}  # by class: the tenants with a profile (derived)

    def add_key(self, key: Any) -> list[float | None]:
        cls, tenant = key
        if tenant:
            self.tenants.setdefault(cls, []).append(tenant)
        return super().add_key(key)

    def compatible(self, *, bucket_ms: int, alpha: float) -> bool:
        return (self.bucket_ms, self.alpha) == (bucket_ms, alpha)

    def observe(self, cls: str, tenant: str, now_ms: int) -> None:
        """One arrival of ``tenant`` in ``cls`` at ``now_ms`` (non-decreasing)."""
        if now_ms // self.bucket_ms != self.bucket:
            self.roll(now_ms)
        counts = self.counts
        counts[(cls, tenant)] = counts.get((cls, tenant), 0) + 1
        counts[(cls, "")] = counts.get((cls, ""), 0) + 1

    def covers(self, start_ms: float, end_ms: float) -> bool:
        """Whether some day was counted whole in every bucket of ``(start_ms, end_ms]`` after the one
        ``start_ms`` falls in (that one may be the first after a start, never counted whole), and in
        that one too when the span ends in it."""
        width, covered = self.bucket_ms, self.covered
        first, last = int(start_ms // width), int(end_ms // width)
        if last == first:
            return covered[first % len(covered)]
        if last - first > len(covered):
            return all(covered)
        return all(covered[i % len(covered)] for i in range(first + 1, last + 1))

    def expected(self, cls: str, tenant: str, start_ms: float, end_ms: float) -> float:
        """Arrivals of ``tenant`` in ``cls`` expected within ``(start_ms, end_ms]`` (``tenant`` "":
        the class's), each bucket's average spread evenly over it; 0 where none was learned."""
        profile = self.profiles.get((cls, tenant))
        if profile is None or end_ms <= start_ms:
            return 0.0
        width, buckets, total = self.bucket_ms, len(profile), 0.0
        index = int(start_ms // width)
        while index * width < end_ms:
            value = profile[index % buckets]
            if value:
                low, high = max(start_ms, index * width), min(end_ms, (index + 1) * width)
                total += value * (high - low) / width
            index += 1
        return total

    def turned(self, buckets: int) -> DemandProfile:
        """A copy at rest (no bucket being counted) whose bucket ``i`` holds this one's ``i -
        buckets``: the profile on a clock ``buckets`` buckets ahead of this one's."""
        turned = DemandProfile(bucket_ms=self.bucket_ms, alpha=self.alpha)
        cut = len(self.covered) - buckets % len(self.covered)
        for key, profile in self.profiles.items():
            turned.add_key(key)[:] = profile[cut:] + profile[:cut]
        turned.covered = self.covered[cut:] + self.covered[:cut]
        return turned

    def as_record(self) -> dict[str, Any]:
        return {
            "bucket_ms": self.bucket_ms,
            "alpha": self.alpha,
            "profiles": [[cls, tenant, profile] for (cls, tenant), profile in self.profiles.items()],
            "covered": list(self.covered),
            "bucket": self.bucket,
            "counts": [[cls, tenant, count] for (cls, tenant), count in self.counts.items()],
            "counting_whole": self.counting_whole,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> DemandProfile:
        demand = cls(bucket_ms=record["bucket_ms"], alpha=record["alpha"])
        for name, tenant, profile in record["profiles"]:
            demand.add_key((name, tenant))[:] = profile
        demand.covered = list(record["covered"])
        demand.bucket = record["bucket"]
        demand.counts = {(name, tenant): count for name, tenant, count in record["counts"]}
        demand.counting_whole = record["counting_whole"]
        return demand
