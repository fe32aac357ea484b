"""Storage behind the scheduler: the few primitives the policy needs, and the in-memory twin.

What must survive a process is in the store: the tickets (``Ticket.as_record``), the fair-share
counters, and the backends' sliding TPM/RPM windows; the indexes (deques, heaps) are derived and
rebuilt from it. :class:`MemoryStore` is the in-memory twin the engine runs on. What a store must
do: docs/engine.md, "The store".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from .model import Request, RequestId

if TYPE_CHECKING:
    from .counters import TenantInClass
    from .fairness import Lane, TenantQueue

WAITING, RUNNING, DONE = 0, 1, 2
STATE_NAMES = {WAITING: "queued", RUNNING: "running"}
# The first ETA given (``eta``): expected start, higher-class arrivals then, the model's slots then,
# when given, the model's wait then, its calibration key.
EtaFirst = tuple[int, int, int, int, int, str]


class Ticket:
    """The engine's record of one admitted request (mutable; ``__slots__`` for speed)."""

    __slots__ = (
        "request",
        "id",
        "tenant",
        "cls",
        "model",
        "enqueued_ms",
        "qseq",
        "state",
        "cost_tokens",
        "est_tokens",
        "deadline_ms",
        "backend",
        "dispatched_ms",
        "charge",
        "charge_lane",
        "charge_by_tokens",
        "window_handle",
        "promoted",
        "vip",
        "tq",
        "tq_no",
        "lane",
        "book",
        "eta_first",
    )

    def __init__(self, request: Request, qseq: int, vip: bool) -> None:
        self.request = request
        self.id = request.id
        self.tenant = request.tenant
        self.cls = request.cls
        self.model = request.model
        self.enqueued_ms = request.enqueued_ms
        self.qseq = qseq
        self.state = WAITING
        self.cost_tokens = request.prompt_tokens + 2 * request.expected_output_tokens
        self.est_tokens = request.prompt_tokens + request.expected_output_tokens
        self.deadline_ms: int | None = None
        self.backend: str | None = None
        self.dispatched_ms: int | None = None
        self.charge = 0.0
        self.charge_lane: tuple[str, str] | None = None  # lane whose fair counter was charged
        self.charge_by_tokens = False  # charged per token (weighted_fair_tokens): corrected at completion
        self.window_handle: int | None = None
        self.promoted = False
        self.vip = vip
        self.tq: TenantQueue | None = None  # TenantQueue holding it while waiting (index, not persisted)
        self.tq_no = 0  # its number in that queue (index)
        self.lane: Lane | None = None  # Lane holding it while waiting (index, not persisted)
        self.book: TenantInClass | None = None  # of its class and tenant, set once admitted (index, not persisted)
        self.eta_first: EtaFirst | None = None  # the first ETA given (``eta``)

    def as_record(self) -> dict[str, object]:
        r = self.request
        return {
            "id": r.id,
            "tenant": r.tenant,
            "cls": r.cls,
            "model": r.model,
            "prompt_tokens": r.prompt_tokens,
            "expected_output_tokens": r.expected_output_tokens,
            "enqueued_ms": r.enqueued_ms,
            "deadline_ms": r.deadline_ms,
            "vip": self.vip,
            "qseq": self.qseq,
            "state": self.state,
            "backend": self.backend,
            "dispatched_ms": self.dispatched_ms,
            "charge": self.charge,
            "charge_lane": list(self.charge_lane) if self.charge_lane else None,
            "charge_by_tokens": self.charge_by_tokens,
            "window_handle": self.window_handle,
        }


class SchedulerStore(Protocol):
    def ticket_put(self, ticket: Ticket) -> None: ...
    def ticket_get(self, request_id: RequestId) -> Ticket | None: ...
    def ticket_pop(self, request_id: RequestId) -> Ticket | None: ...
    def tickets(self) -> Iterable[Ticket]: ...
    def fair_counter_get(self, key: tuple[str, str, str]) -> float | None: ...
    def fair_counter_set(self, key: tuple[str, str, str], value: float) -> None: ...
    def window_add(self, key: str, at_ms: int, amount: float) -> int: ...
    def window_adjust(self, key: str, handle: int, delta: float) -> None: ...
    def window_usage(self, key: str, now_ms: int, span_ms: int) -> tuple[float, int, int | None]: ...


WINDOW_ENTRY_MS = 250  # a sliding window's resolution: samples this close to an entry's first one share it


class _Sample:
    """One entry of a sliding window: the samples added from ``first_ms`` until less than
    `WINDOW_ENTRY_MS` after it, with their sum and count; it leaves the window when its newest
    sample (``at_ms``) does."""

    __slots__ = ("at_ms", "amount", "handle", "first_ms", "count")

    def __init__(self, at_ms: int, amount: float, handle: int) -> None:
        self.at_ms = at_ms
        self.amount = amount
        self.handle = handle
        self.first_ms = at_ms
        self.count = 1


class _Window:
    """A sliding window (TPM/RPM of a backend) in entries of at most `WINDOW_ENTRY_MS`.

    A sample that comes less than `WINDOW_ENTRY_MS` after the first sample of the newest entry is
    added to that entry, and the entry stays in the window until its newest sample leaves. So a
    window holds at most ``span_ms / WINDOW_ENTRY_MS + 1`` entries whatever the request rate (the
    shared dispatcher's snapshot carries it: one object per request made it grow to millions at
    high rates, and take seconds to record), and it never counts less than the exact window: an
    upstream limit is never exceeded, and a sample may be counted up to `WINDOW_ENTRY_MS` longer
    than exactly (samples at one instant, or further apart, are counted exactly). A correction
    (`MemoryStore.window_adjust`) goes to the sample's entry while that entry is in the window."""

    __slots__ = ("samples", "total", "by_handle", "requests")

    def __init__(self) -> None:
        self.samples: deque[_Sample] = deque()  # in time order
        self.total = 0.0
        self.by_handle: dict[int, _Sample] = {}
        self.requests = 0  # samples counted (the entries' counts)


class MemoryStore:
    """Dicts and deques; ticket records are the live objects (no copy on put)."""

    holds_live_tickets = True  # see docs/engine.md, "The store"

    def __init__(self) -> None:
        self._tickets: dict[RequestId, Ticket] = {}
        self._fair: dict[tuple[str, str, str], float] = {}
        self._windows: dict[str, _Window] = {}
        self._next_handle = 0

    def ticket_put(self, ticket: Ticket) -> None:
        self._tickets[ticket.id] = ticket

    def ticket_get(self, request_id: RequestId) -> Ticket | None:
        return self._tickets.get(request_id)

    def ticket_pop(self, request_id: RequestId) -> Ticket | None:
        return self._tickets.pop(request_id, None)

    def tickets(self) -> Iterable[Ticket]:
        return list(self._tickets.values())

    def fair_counter_get(self, key: tuple[str, str, str]) -> float | None:
        return self._fair.get(key)

    def fair_counter_set(self, key: tuple[str, str, str], value: float) -> None:
        self._fair[key] = value

    def window_add(self, key: str, at_ms: int, amount: float) -> int:
        """Adds a sample at ``at_ms`` (non-decreasing per window); its handle (its entry's, see `_Window`)."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window()
        window.total += amount
        window.requests += 1
        samples = window.samples
        if samples:
            newest = samples[-1]
            if at_ms - newest.first_ms < WINDOW_ENTRY_MS:
                newest.amount += amount
                newest.count += 1
                newest.at_ms = max(newest.at_ms, at_ms)
                return newest.handle
        self._next_handle += 1
        sample = _Sample(at_ms, amount, self._next_handle)
        samples.append(sample)
        window.by_handle[self._next_handle] = sample
        return self._next_handle

    def window_adjust(self, key: str, handle: int, delta: float) -> None:
        window = self._windows.get(key)
        if window is None:
            return
        sample = window.by_handle.get(handle)
        if sample is not None:  # already out of the window: nothing to correct
            sample.amount += delta
            window.total += delta

    def window_usage(self, key: str, now_ms: int, span_ms: int) -> tuple[float, int, int | None]:
        """(sum, sample count, newest sample of the oldest entry, ms) over ``(now_ms - span_ms, now_ms]``:
        the window changes next when that entry leaves (see `_Window`)."""
        window = self._windows.get(key)
        if window is None:
            return 0.0, 0, None
        samples = window.samples
        horizon = now_ms - span_ms
        while samples and samples[0].at_ms <= horizon:
            sample = samples.popleft()
            window.total -= sample.amount
            window.requests -= sample.count
            del window.by_handle[sample.handle]
        if not samples:
            window.total = 0.0  # drop float drift
            return 0.0, 0, None
        return window.total, window.requests, samples[0].at_ms
