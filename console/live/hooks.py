"""Database events for the console, published only after the transaction that wrote them commits.

Billing announces the charges it booked and the budget alerts it raised once they have committed
(billing.news), in the process that serves the requests (a gateway announces what its billing
worker booked when the answer arrives). There the rows go to the publisher (coalesced into its
next tick); elsewhere (a Celery worker, a command) straight to the channel layer.
"""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from billing.news import alerts_raised, charges_booked
from console import selectors
from console.live.groups import FINANCE_GROUP, tenant_group

log = logging.getLogger(__name__)


def publish_committed(events: list[dict]) -> None:
    """``[{"kind", "tenant_id", "row"}, ...]`` → the tenants' viewers (and finance), after commit."""
    from console.live.publisher import publisher_running

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


def _on_charges_booked(sender, charges: list, **kwargs) -> None:
    from console.live.publisher import publisher_running

    publisher = publisher_running()
    if publisher is not None and publisher.on_its_loop():  # a row only where someone watches
        publisher.add_charges(charges, lambda entry: selectors.charge_row(entry, ""))
        return
    publish_committed(
        [{"kind": "charges", "tenant_id": e.tenant_id, "row": selectors.charge_row(e, "")} for e in charges]
    )


def _on_alerts_raised(sender, alerts: list, **kwargs) -> None:
    publish_committed([{"kind": "alerts", "tenant_id": a.tenant_id, "row": selectors.alert_row(a)} for a in alerts])


def connect() -> None:
    charges_booked.connect(_on_charges_booked, dispatch_uid="console-ledger-charge")
    alerts_raised.connect(_on_alerts_raised, dispatch_uid="console-budget-alert")
