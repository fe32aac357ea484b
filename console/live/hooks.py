"""The console's subscription to live events (events.subscribe): charges, budget alerts and
downgrades, each received once its transaction has committed. In the serving process they go to
the publisher (coalesced into its next tick; on its own loop a tenant's events are unpacked only
if a socket of this process watches it); elsewhere (a Celery worker, a command) straight to the
channel layer.
"""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

import events
from console.live.groups import FINANCE_GROUP, tenant_group
from console.live.publisher import publisher_running

log = logging.getLogger(__name__)
SUBSCRIBER = "console"
ROW_KINDS = {"charge": "charges", "alert": "alerts", "downgrade": "downgrades"}  # event kind -> message key


def console_event(event: events.Event) -> dict | None:
    """``{"kind", "tenant_id", "row"}`` of a live event the console shows (None: one it does not)."""
    kind = ROW_KINDS.get(event.kind)
    if kind is None:
        return None
    return {"kind": kind, "tenant_id": event.tenant_id, "row": dict(event.payload)}


def publish_committed(rows: list[dict]) -> None:
    """``[{"kind", "tenant_id", "row"}, ...]`` → the tenants' viewers (and finance), after commit."""
    publisher = publisher_running()
    try:
        if publisher is not None:
            publisher.notify_threadsafe(rows)
            return
        layer = get_channel_layer()
        if layer is None:
            return
        by_tenant: dict[int, dict[str, list]] = {}
        for row in rows:  # one message per tenant, one for finance
            by_tenant.setdefault(row["tenant_id"], {}).setdefault(row["kind"], []).append(row["row"])
        for tenant_id, kinds in by_tenant.items():
            text = json.dumps({"type": "update", **kinds}, default=str)
            async_to_sync(layer.group_send)(tenant_group(tenant_id), {"type": "tenant.update", "text": text})
        tenants = sorted({str(r["tenant_id"]) for r in rows if r["kind"] in ("charges", "alerts")})
        if tenants:
            finance = json.dumps({"type": "finance", "tenants": tenants})
            async_to_sync(layer.group_send)(FINANCE_GROUP, {"type": "finance.update", "text": finance})
    except Exception:  # the write has committed; a lost live event must not fail it
        log.exception("could not publish a console event")


def on_committed(committed: events.Committed) -> None:
    publisher = publisher_running()
    if publisher is not None and publisher.on_its_loop():  # a row only where someone watches
        publisher.add_committed(committed, console_event)
        return
    rows = [row for row in map(console_event, committed) if row is not None]
    if rows:
        publish_committed(rows)


def connect() -> None:
    events.subscribe(SUBSCRIBER, on_committed)
