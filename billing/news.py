"""What billing tells the rest of the house once a booking has committed: the charges it appended
and the budget alerts it raised. Receivers (the console's live feed) connect to the two signals.

News is announced in the process that serves the requests. The gateway's billing worker keeps
what it books (`keep_for_the_gateway`) and sends it back with its answer; the gateway announces
it when that answer arrives (gateway.charging). Elsewhere (a Celery task, a command, a test
booking directly) it is announced where it was booked, after the commit.
"""

from __future__ import annotations

from collections.abc import Iterable
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


News = tuple[list, list[AlertRaised]]  # (charges, alerts)
_kept: News | None = None


def keep_for_the_gateway() -> None:
    """In the billing worker: keep the news of what it books; its answers carry it (`taken`)."""
    global _kept
    _kept = ([], [])


def taken() -> News:
    """The news kept since the last call (empty outside the worker)."""
    if _kept is None:
        return [], []
    charges, alerts = list(_kept[0]), list(_kept[1])
    _kept[0].clear()
    _kept[1].clear()
    return charges, alerts


def announce(*, charges: Iterable = (), alerts: Iterable[AlertRaised] = ()) -> None:
    """Committed news: kept for the gateway in its billing worker, sent to the receivers elsewhere."""
    charges, alerts = list(charges), list(alerts)
    if _kept is not None:
        _kept[0].extend(charges)
        _kept[1].extend(alerts)
        return
    if charges:
        charges_booked.send(sender=None, charges=charges)
    if alerts:
        alerts_raised.send(sender=None, alerts=alerts)
