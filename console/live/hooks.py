"""Database events for the console, published only after the transaction that wrote them commits.

Billing announces the ledger entries it booked once they have committed (``entries_booked``); alerts
are created with ``Model.objects.create``, and their receiver registers a ``transaction.on_commit``
callback, so a rolled-back alert is never shown. In the serving process the callback hands the event
to the publisher (coalesced into its next tick); elsewhere (a Celery worker, a command) it sends it
to the channel layer directly.
"""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models.signals import post_save

from billing.booking import entries_booked
from billing.models import BudgetAlert, LedgerEntry
from billing.worker import hand_back
from console import selectors
from console.live.groups import FINANCE_GROUP, tenant_group

log = logging.getLogger(__name__)


def publish_committed(events: list[dict]) -> None:
    """``[{"kind", "tenant_id", "row"}, ...]`` → the tenants' viewers (and finance), after commit."""
    from console.live.publisher import publisher_running

    if hand_back(events):  # in the gateway's billing worker: the gateway publishes them (gateway.charging)
        return
    publisher = publisher_running()
    try:
        if publisher is not None:
            publisher.notify_threadsafe(events)
            return
        layer = get_channel_layer()
        if layer is None:
            return
        by_tenant: dict[int, dict[str, list]] = {}
        for event in events:  # one message per tenant, one for finance
            by_tenant.setdefault(event["tenant_id"], {}).setdefault(event["kind"], []).append(event["row"])
        for tenant_id, rows in by_tenant.items():
            text = json.dumps({"type": "update", **rows}, default=str)
            async_to_sync(layer.group_send)(tenant_group(tenant_id), {"type": "tenant.update", "text": text})
        tenants = sorted({e.get("slug") or str(e["tenant_id"]) for e in events})
        if tenants:
            finance = json.dumps({"type": "finance", "tenants": tenants})
            async_to_sync(layer.group_send)(FINANCE_GROUP, {"type": "finance.update", "text": finance})
    except Exception:  # the write has committed; a lost live event must not fail it
        log.exception("could not publish a console event")


def _on_entries_booked(sender, entries: list, **kwargs) -> None:
    """Billing's booked entries (already committed): the charges go to the live console."""
    publish_committed(
        [
            {"kind": "charges", "tenant_id": e.tenant_id, "row": selectors.charge_row(e, "")}
            for e in entries
            if e.kind == LedgerEntry.Kind.CHARGE
        ]
    )


def _on_budget_alert(sender, instance: BudgetAlert, created: bool, **kwargs) -> None:
    if created:
        tenant_id = instance.budget.tenant_id
        event = {"kind": "alerts", "tenant_id": tenant_id, "row": selectors.alert_row(instance)}
        transaction.on_commit(lambda: publish_committed([event]))


def connect() -> None:
    entries_booked.connect(_on_entries_booked, dispatch_uid="console-ledger-charge")
    post_save.connect(_on_budget_alert, sender=BudgetAlert, dispatch_uid="console-budget-alert")
