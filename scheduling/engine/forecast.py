"""Arrival forecasts: the top class's (a time-of-day profile blended with the recent rate, for
headroom) and every (class, tenant)'s time-of-day profile (``DemandProfile``, for prediction).

The profile is an exponentially weighted average per time-of-day bucket over the days seen; the
recent rate decays with ``recent_ms``; the forecast is ``profile_weight`` of the one and the rest of
the other (the recent rate alone where the profile has no value). Its state is part of the engine,
so the shared dispatcher's snapshot carries it. Details and why: docs/engine.md, "The arrival
forecast" and "Foreseen demand".
"""

from __future__ import annotations

import math
from typing import Any

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


class DemandProfile:
    """Arrivals per (class, tenant) and time-of-day bucket, averaged over the days seen, for
    predicted admission (docs/engine.md, "Foreseen demand"). Unlike ``ArrivalForecast`` every key
    learns when the engine's bucket ends, so a key's buckets without arrivals learn 0 at once and a
    key's first bucket is whole when the engine's is. The key ``(class, "")`` is the class's total."""

    __slots__ = ("bucket_ms", "alpha", "profiles", "covered", "bucket", "counts", "counting_whole", "tenants")

    def __init__(self, *, bucket_ms: int, alpha: float) -> None:
        if bucket_ms <= 0 or DAY_MS % bucket_ms:
            raise ValueError(f"bucket_ms {bucket_ms} must divide a day")
        self.bucket_ms = bucket_ms
        self.alpha = alpha
        buckets = DAY_MS // bucket_ms
        self.profiles: dict[tuple[str, str], list[float | None]] = {}  # arrivals per bucket, over days
        self.covered = [False] * buckets  # some day was counted whole in the bucket
        self.bucket: int | None = None  # absolute number of the bucket being counted
        self.counts: dict[tuple[str, str], int] = {}  # arrivals counted in it, by key
        self.counting_whole = False  # it was counted from its start
        self.tenants: dict[str, list[str]] = {}  # by class: the tenants with a profile (derived)

    def compatible(self, *, bucket_ms: int, alpha: float) -> bool:
        return (self.bucket_ms, self.alpha) == (bucket_ms, alpha)

    def observe(self, cls: str, tenant: str, now_ms: int) -> None:
        """One arrival of ``tenant`` in ``cls`` at ``now_ms`` (non-decreasing)."""
        index = now_ms // self.bucket_ms
        if index != self.bucket:
            self._roll(index)
        counts = self.counts
        counts[(cls, tenant)] = counts.get((cls, tenant), 0) + 1
        counts[(cls, "")] = counts.get((cls, ""), 0) + 1

    def _roll(self, index: int) -> None:
        if self.bucket is None or index < self.bucket:
            self.bucket, self.counting_whole = index, False
            return
        if self.counting_whole:
            self._learn(self.bucket, self.counts)
        for passed in range(max(self.bucket + 1, index - len(self.covered)), index):
            self._learn(passed, {})
        self.bucket, self.counts, self.counting_whole = index, {}, True

    def _learn(self, bucket: int, counts: dict[tuple[str, str], int]) -> None:
        slot, buckets = bucket % len(self.covered), len(self.covered)
        self.covered[slot] = True
        for key in [key for key in counts if key not in self.profiles]:
            self.profiles[key] = [None] * buckets
            if key[1]:
                self.tenants.setdefault(key[0], []).append(key[1])
        for key, profile in self.profiles.items():
            count, old = counts.get(key, 0), profile[slot]
            profile[slot] = float(count) if old is None else old + self.alpha * (count - old)

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
            demand.profiles[(name, tenant)] = list(profile)
            if tenant:
                demand.tenants.setdefault(name, []).append(tenant)
        demand.covered = list(record["covered"])
        demand.bucket = record["bucket"]
        demand.counts = {(name, tenant): count for name, tenant, count in record["counts"]}
        demand.counting_whole = record["counting_whole"]
        return demand
