"""What billing tells the rest of the house once a booking has committed: the charges it appended
and the budget alerts it raised. Receivers (the console's live feed) connect to the two signals.

News is announced in the process that serves the requests. The gateway's billing worker keeps
what it books (`keep_for_the_gateway`) and sends it back with its answer; the gateway announces
it when that answer arrives (billing.client.group_commit). Elsewhere (a Celery task, a command, a test
booking directly) it is announced where it was booked, after the commit.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.dispatch import Signal

# charges_booked.send(sender=None, charges=[billing.booking.Booked, ...]): ledger charge entries.
charges_booked = Signal()
# alerts_raised.send(sender=None, alerts=[AlertRaised, ...]).
alerts_raised = Signal()


@dataclass(frozen=True)
class AlertRaised:
    """A budget threshold crossed (a BudgetAlert row, as plain data: it crosses processes)."""

    tenant_id: int
    budget: str  # the budget's label
    threshold_pct: int
    spent: Decimal
    limit: Decimal
    at: datetime

    @classmethod
    def of(cls, alert) -> AlertRaised:
        """From a BudgetAlert whose budget (and its tenant) is loaded."""
        return cls(
            alert.budget.tenant_id,
            alert.budget.label,
            alert.threshold_pct,
            alert.spent,
            alert.limit,
            alert.created_at,
        )


class Charges:
    """Charge entries as the billing worker sends them to its gateway: each tenant's pickled apart,
    so the gateway unpickles only the tenants someone watches there (console.live.publisher; the
    finance view needs only which tenants were charged). Iterating gives every entry."""

    def __init__(self, packed: dict[int, bytes]) -> None:
        self.packed = packed  # tenant id -> its entries, pickled

    @classmethod
    def of(cls, charges: Iterable) -> Charges:
        by_tenant: dict[int, list] = {}
        for entry in charges:
            by_tenant.setdefault(entry.tenant_id, []).append(entry)
        return cls({tenant: pickle.dumps(entries, pickle.HIGHEST_PROTOCOL) for tenant, entries in by_tenant.items()})

    @property
    def tenant_ids(self) -> Iterable[int]:
        return self.packed.keys()

    def of_tenant(self, tenant_id: int) -> list:
        return pickle.loads(self.packed[tenant_id])

    def __iter__(self) -> Iterator:
        for tenant_id in self.packed:
            yield from self.of_tenant(tenant_id)

    def __bool__(self) -> bool:
        return bool(self.packed)


News = tuple[list | Charges, list[AlertRaised]]  # (charges, alerts)
_kept: tuple[list, list[AlertRaised]] | None = None  # in the billing worker: what its next answer carries


def keep_for_the_gateway() -> None:
    """In the billing worker: keep the news of what it books; its answers carry it (`taken`)."""
    global _kept
    _kept = ([], [])


def taken() -> News:
    """The news kept since the last call (empty outside the worker); the charges as `Charges`."""
    if _kept is None:
        return [], []
    charges: list | Charges = Charges.of(_kept[0]) if _kept[0] else []
    alerts = list(_kept[1])
    _kept[0].clear()
    _kept[1].clear()
    return charges, alerts


def announce(*, charges: Iterable = (), alerts: Iterable[AlertRaised] = ()) -> None:
    """Committed news: kept for the gateway in its billing worker, sent to the receivers elsewhere."""
    told = charges if isinstance(charges, Charges) else list(charges)
    alerts = list(alerts)
    if _kept is not None:
        _kept[0].extend(told)
        _kept[1].extend(alerts)
        return
    if told:
        charges_booked.send(sender=None, charges=told)
    if alerts:
        alerts_raised.send(sender=None, alerts=alerts)
