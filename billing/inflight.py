"""The holds of this process's requests in flight: the serving process's memo (one per gateway).

A hold ledger entry never changes once committed (the ledger is append-only), so a copy of it is
exact for as long as it is kept. The gateway's Booker (billing.client.group_commit) remembers each hold its
billing worker booked and forgets it once its end is booked; each settlement and release carries
its hold from here, so the booking reads no hold entry for it. An end without one (replayed from a
journal, asked by another process, the memo full) reads the entry from the ledger (`held_get`).
The console's queue table reads the memo too. Bounded: the oldest entries go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from decimal import Decimal
from typing import NamedTuple

from billing.cache import on_invalidate
from billing.models import LedgerEntry
from billing.wire import pickled_as_tuple

MAX_ENTRIES = 100_000
UNLIMITED = Decimal("Infinity")  # the room of budgets without a limit


@pickled_as_tuple
class HeldEntry(NamedTuple):
    """The fields of a hold entry that its release and charge entries copy."""

    request_id: str
    tenant_id: int
    budget_id: int
    month_budget_id: int | None
    class_name: str
    price_version_id: int | None
    model: str
    factor: Decimal
    amount: Decimal
    owner: str = ""  # the gateway process that holds it (billing.heartbeats)
    key_prefix: str = ""  # who spends (billing.booking_asks.HoldAsk)
    job_id: str = ""
    key_creator: str = ""
    # Not a ledger column: what the tenant's budgets had left once this hold was booked (the least
    # of them; Infinity without a limit; None when not known, e.g. read back from the ledger). The
    # gateway decides from it whether its next holds may be booked while their requests go on.
    room: Decimal | None = None

    def __eq__(self, other: object) -> bool:  # the room is not part of the entry
        return type(other) is HeldEntry and self[:-1] == other[:-1]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:-1])

    @property
    def budget_ids(self) -> tuple[int, ...]:
        return (self.budget_id,) if self.month_budget_id is None else (self.budget_id, self.month_budget_id)

    def booked_as(self, request_id: str, room: Decimal | None = None) -> HeldEntry:
        """This entry under ``request_id``, with ``room`` (not ``_replace``: several times slower,
        and the billing worker makes one for every hold it books)."""
        return tuple.__new__(HeldEntry, (request_id, *self[1:-1], room))


FIELDS = HeldEntry._fields[:-1]  # the ledger's columns
_memo: OrderedDict[str, HeldEntry] = OrderedDict()
_lock = threading.Lock()


def held_remember(entry: HeldEntry) -> None:
    with _lock:
        _memo[entry.request_id] = entry
        while len(_memo) > MAX_ENTRIES:
            _memo.popitem(last=False)


def held_forget(request_id: str) -> None:
    with _lock:
        _memo.pop(request_id, None)


def held_clear() -> None:
    with _lock:
        _memo.clear()


def held_get_cached(request_id: str) -> HeldEntry | None:
    """The request's hold if this process holds it in flight (no query)."""
    with _lock:
        return _memo.get(request_id)


def held_get(request_id: str) -> HeldEntry | None:
    """The request's hold, from the memo or else from the ledger; None if it was never held."""
    with _lock:
        found = _memo.get(request_id)
    if found is not None:
        return found
    rows = LedgerEntry.objects.of_requests([request_id]).values("kind", *FIELDS)
    row = next((r for r in rows if r.pop("kind") == LedgerEntry.Kind.HOLD), None)
    return None if row is None else HeldEntry(**row)


# Dropped with the configuration caches: only a test database that was flushed can make a
# committed hold disappear, and every test builds its world through the signals that land here.
on_invalidate(held_clear)
