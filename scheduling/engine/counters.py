"""Event counters per class and per tenant, with wait-time histograms.

A :class:`Tally` counts what happened to requests (admitted, dispatched, completed, failed,
requeued, refused, timed out, fast-failed, cancelled, boosted, preempted) and their waits per bucket
of :data:`WAIT_BUCKETS_MS`. For every class and tenant, ``enqueued == completed + failed +
queue_timeout + cancelled + waiting + running``.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, fields

WAIT_BUCKETS_MS = (100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 900000, 1800000, 3600000)


def wait_bucket(waited_ms: int) -> int:
    """Index of the :data:`WAIT_BUCKETS_MS` bucket holding ``waited_ms`` (binary search)."""
    return bisect_left(WAIT_BUCKETS_MS, waited_ms)


@dataclass(slots=True)
class Tally:
    enqueued: int = 0
    dispatched: int = 0
    completed: int = 0
    failed: int = 0
    requeued: int = 0
    rejected_queue_full: int = 0
    rejected_no_backend: int = 0
    queue_timeout: int = 0
    fast_failed: int = 0
    cancelled: int = 0
    boosted: int = 0
    preempted: int = 0
    wait_hist: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS_MS) + 1))

    def record_wait(self, waited_ms: int) -> None:
        self.wait_hist[wait_bucket(waited_ms)] += 1

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["wait_hist"] = list(self.wait_hist)
        return out


class TenantInClass:
    """A tenant's bookkeeping within one class: the two tallies its events count into (the
    class's and the tenant's), how many of its requests wait in the class (for admission), how
    many were dispatched, and since when it has had requests waiting without a break, with its
    dispatch count then (its measured drain, for admission by prediction); a backlog measured for a
    window goes on through a break in its queue shorter than a window (``idle_ms``: when it began)."""

    __slots__ = ("tallies", "waiting", "dispatched", "since_ms", "base", "idle_ms")

    def __init__(self, cls_tally: Tally, tenant_tally: Tally) -> None:
        self.tallies = (cls_tally, tenant_tally)
        self.waiting = 0
        self.dispatched = 0
        self.since_ms: float | None = None  # None: no backlog
        self.base = 0
        self.idle_ms: float | None = None  # when the queue of a measured backlog emptied (None: it did not)


class Counters:
    """``classes[name]`` and ``tenants[slug]`` tallies, created on first use."""

    __slots__ = ("classes", "tenants")

    def __init__(self) -> None:
        self.classes: dict[str, Tally] = {}
        self.tenants: dict[str, Tally] = {}

    def for_class(self, cls: str) -> Tally:
        tally = self.classes.get(cls)
        if tally is None:
            tally = self.classes[cls] = Tally()
        return tally

    def for_tenant(self, tenant: str) -> Tally:
        tally = self.tenants.get(tenant)
        if tally is None:
            tally = self.tenants[tenant] = Tally()
        return tally

    def pair(self, cls: str, tenant: str) -> tuple[Tally, Tally]:
        return self.for_class(cls), self.for_tenant(tenant)

    def total(self, name: str) -> int:
        """Sum of one field over all classes (every event is counted once per class)."""
        return sum(getattr(t, name) for t in self.classes.values())

    def as_dict(self) -> dict[str, object]:
        return {
            "classes": {k: v.as_dict() for k, v in sorted(self.classes.items())},
            "tenants": {k: v.as_dict() for k, v in sorted(self.tenants.items())},
            "wait_buckets_ms": list(WAIT_BUCKETS_MS),
        }
