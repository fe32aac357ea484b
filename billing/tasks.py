"""Celery tasks: the sweeps of crash leftovers and budget-alert delivery (eager in the embedded
default).

Schedule (celery beat, ``CELERY_BEAT_SCHEDULE``): ``billing.holds_release_orphaned`` every
``FAIRGATE_ORPHAN_SWEEP_S`` (the holds of gateway processes that died, billing.heartbeats; every
live gateway's billing worker runs the same sweep, so holds are released even without beat),
``billing.holds_sweep`` every 5 minutes (the same, plus holds with no owner older than
``FAIRGATE_BILLING_STALE_HOLD_S``). No sweep releases a live owner's hold, however old.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task

from billing.alerts import alert_deliver, alert_deliver_now, alerts_pending_ids
from billing.alerts import budgets_forecast as _budgets_forecast
from billing.booking_asks import OWNER_GONE_REASON
from billing.heartbeats import holds_release_leftovers
from billing.heartbeats import holds_release_orphaned as _holds_release_orphaned
from billing.services import holds_release_forced

# alert_deliver is billing.alerts' (recording an alert enqueues it); named here, where Celery looks for tasks
__all__ = ["alert_deliver", "budgets_forecast", "holds_release_at_startup", "holds_release_orphaned", "holds_sweep"]


@shared_task(name="billing.holds_sweep", ignore_result=True)
def holds_sweep() -> int:
    """Release crash leftovers (by liveness), then retry alert deliveries that failed."""
    released = holds_release_leftovers()
    for alert_id in alerts_pending_ids():
        alert_deliver_now(alert_id=alert_id)
    return released


@shared_task(name="billing.budgets_forecast", ignore_result=True)
def budgets_forecast() -> int:
    """Forecast alerts for the budgets that run out before their period ends at the current burn."""
    return len(_budgets_forecast())


@shared_task(name="billing.holds_release_orphaned", ignore_result=True)
def holds_release_orphaned() -> int:
    """Release the open holds of gateway processes that are dead for billing."""
    return _holds_release_orphaned()


def holds_release_at_startup(*, sole_process: bool) -> int:
    """Call once when the gateway starts. The sole process of the embedded default lost its
    in-memory queue, so every open hold is a leftover; with several gateway processes only the
    holds of dead owners, and unowned ones past their age, are (as every sweep releases)."""
    if sole_process:
        return holds_release_forced(older_than=timedelta(0), reason=OWNER_GONE_REASON)
    return holds_release_leftovers()
