"""Celery tasks: the stale-hold sweep and budget-alert delivery (eager in the embedded default).

Schedule (celery beat, see the report): billing.tasks.holds_sweep every 5 minutes.
"""
from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from billing.alerts import alert_deliver_now, alerts_pending_ids
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


def holds_release_at_startup(*, sole_process: bool) -> int:
    """Call once when the gateway starts. The sole process of the embedded default lost its
    in-memory queue, so every open hold is a leftover; with several gateway processes only holds
    older than the stale age are (another process may still be serving the younger ones)."""
    return holds_release_stale(older_than=timedelta(0) if sole_process else stale_hold_age())
