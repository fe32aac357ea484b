"""Celery tasks: the sweeps of crash leftovers and budget-alert delivery (eager in the embedded
default).

Schedule (celery beat, ``CELERY_BEAT_SCHEDULE``): ``billing.holds_release_orphaned`` every
``FAIRGATE_ORPHAN_SWEEP_S`` (the holds of gateway processes that died, billing.heartbeats; every
live gateway's billing worker runs the same sweep, so holds are released even without beat),
``billing.holds_sweep`` every 5 minutes (holds older than the stale age, whoever booked them).
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from billing.alerts import alert_deliver_now, alerts_pending_ids
from billing.heartbeats import holds_release_orphaned as _holds_release_orphaned
from billing.services import holds_release_stale

DEFAULT_STALE_HOLD_S = 2 * 3600  # longer than the longest SLA (BATCH 30 min) plus a long generation


def stale_hold_age() -> timedelta:
    return timedelta(seconds=int(getattr(settings, "FAIRGATE_BILLING_STALE_HOLD_S", DEFAULT_STALE_HOLD_S)))


@shared_task(name="billing.alert_deliver", ignore_result=True)
def alert_deliver(alert_id: int) -> None:
    alert_deliver_now(alert_id=alert_id)


@shared_task(name="billing.holds_sweep", ignore_result=True)
def holds_sweep() -> int:
    """Release crash leftovers, then retry alert deliveries that failed."""
    released = holds_release_stale(older_than=stale_hold_age())
    for alert_id in alerts_pending_ids():
        alert_deliver_now(alert_id=alert_id)
    return released


@shared_task(name="billing.holds_release_orphaned", ignore_result=True)
def holds_release_orphaned() -> int:
    """Release the open holds of gateway processes that are dead for billing."""
    return _holds_release_orphaned()


def holds_release_at_startup(*, sole_process: bool) -> int:
    """Call once when the gateway starts. The sole process of the embedded default lost its
    in-memory queue, so every open hold is a leftover; with several gateway processes only holds
    older than the stale age are (another process may still be serving the younger ones)."""
    return holds_release_stale(older_than=timedelta(0) if sole_process else stale_hold_age())
