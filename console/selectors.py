"""Console reads from the database, always scoped by a tenant the caller may see.

Money leaves here as exact strings (never float); times as ISO 8601.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db.models import Count

from audit.models import AuditLog
from batches.models import Batch, BatchLine
from batches.service import WAITING
from billing.inflight import held_get_cached
from billing.models import BudgetAlert, LedgerEntry
from billing.news import alert_news, charge_news
from billing.reports import budget_burn
from gateway.api import DowngradeEvent
from tenants.models import ApiKey, Tenant

RECENT = 20


def _text(value) -> str | None:
    return None if value is None else str(value)


def public_id(request_id: str, slug: str) -> str:
    """The client's id from a ledger request id (stored plain or as ``<tenant>/<id>``)."""
    return request_id.removeprefix(f"{slug}/")


def budget_of(*, tenant: Tenant) -> dict:
    """The budget bar: billing's burn report for one tenant (spent, held, remaining, limit), from
    its budget row alone (the live console refreshes it every few seconds under traffic)."""
    rows = budget_burn(tenants=Tenant.objects.filter(pk=tenant.pk), with_overrun=False)
    row = rows[0] if rows else {}
    return {
        "currency": settings.FAIRGATE_CURRENCY,
        **{k: _text(row.get(k)) for k in ("limit", "spent", "held", "remaining", "projected_spend")},
    }


def charge_row(entry: LedgerEntry, slug: str) -> dict:
    return {**charge_news(entry), "request_id": public_id(entry.request_id, slug)}


def charges_recent(*, tenant: Tenant, limit: int = RECENT) -> list[dict]:
    qs = LedgerEntry.objects.filter(tenant=tenant, kind=LedgerEntry.Kind.CHARGE).order_by("-at", "-pk")[:limit]
    return [charge_row(e, tenant.slug) for e in qs]


def charge_of(*, tenant: Tenant, request_id: str) -> dict | None:
    ids = [request_id, f"{tenant.slug}/{request_id}"]
    entries = LedgerEntry.objects.of_requests(ids).filter(tenant=tenant)
    entry = next((e for e in entries if e.kind == LedgerEntry.Kind.CHARGE), None)
    return None if entry is None else charge_row(entry, tenant.slug)


def hold_amounts(*, tenant_id: int, slug: str, request_ids: Iterable[str]) -> dict[str, str]:
    """Held (largest possible) charge per live request: the 'estimated charge' of the queue table.
    This process's requests in flight come from its memo of holds; only the others are read."""
    if not settings.FAIRGATE_BILLING:
        return {}
    found, missing = {}, {}
    for rid in request_ids:
        engine_id = f"{slug}/{rid}"  # the gateway's ledger id of a request
        entry = held_get_cached(engine_id)
        if entry is not None and entry.tenant_id == tenant_id:
            found[rid] = str(entry.amount)
        else:
            missing[engine_id] = missing[rid] = rid
    if missing:
        rows = LedgerEntry.objects.of_requests(missing).filter(tenant_id=tenant_id)
        found.update(
            (missing[ledger_id], str(amount))
            for ledger_id, kind, amount in rows.values_list("request_id", "kind", "amount")
            if kind == LedgerEntry.Kind.HOLD
        )
    return found


def downgrade_row(event: DowngradeEvent) -> dict:
    return {
        "request_id": event.request_id,
        "from": event.from_class,
        "to": event.to_class,
        "rule": event.rule,
        "at": event.at.isoformat(),
    }


def downgrades_recent(*, tenant: Tenant, limit: int = RECENT) -> list[dict]:
    return [downgrade_row(e) for e in DowngradeEvent.objects.filter(tenant=tenant)[:limit]]


def alerts_recent(*, tenant: Tenant, limit: int = RECENT) -> list[dict]:
    qs = BudgetAlert.objects.filter(budget__tenant=tenant).select_related("budget__tenant")[:limit]
    return [alert_news(a) for a in qs]


def keys_of(*, tenant: Tenant) -> list[ApiKey]:
    return list(ApiKey.objects.filter(tenant=tenant).order_by("-created_at"))


def audit_rows(*, entity: str = ""):
    """The audit log, newest first (who, when, what, old → new), optionally of one entity kind."""
    qs = AuditLog.objects.all()
    return qs.filter(entity=entity) if entity else qs


def audit_entities() -> list[str]:
    return list(AuditLog.objects.order_by("entity").values_list("entity", flat=True).distinct())


def tenants_all() -> list[Tenant]:
    """Every tenant, for an administrator's queue picker."""
    return list(Tenant.objects.order_by("name"))


def key_revoke_effects(*, tenant: Tenant, prefix: str) -> list[str] | None:
    """What revoking one of the tenant's keys stops, in words; None if it has no such active key."""
    key = ApiKey.objects.filter(tenant=tenant, prefix=prefix, revoked_at__isnull=True).first()
    if key is None:
        return None
    effects = ["New requests with this key are refused (401 invalid_api_key) within a second."]
    open_batches = Batch.objects.filter(tenant=tenant, key_prefix=prefix, status=Batch.Status.IN_PROGRESS)
    for batch in open_batches.order_by("id")[:20]:
        waiting = batch.lines.filter(state__in=WAITING).count()
        effects.append(f"Batch {batch.id}: its {waiting} waiting lines fail (the key that created it was revoked).")
    effects.append("Requests and batch lines already running finish and are charged.")
    return effects


def batch_cancel_effects(*, tenant: Tenant, batch_id: str) -> list[str] | None:
    """What cancelling one of the tenant's batches stops, in words; None if it is not running."""
    batch = Batch.objects.filter(tenant=tenant, id=batch_id, status=Batch.Status.IN_PROGRESS).first()
    if batch is None:
        return None
    states = dict(batch.lines.order_by().values_list("state").annotate(n=Count("id")))
    waiting = sum(states.get(state, 0) for state in WAITING)
    running = states.get(BatchLine.State.SENT, 0)
    done = states.get(BatchLine.State.COMPLETED, 0)
    return [
        f"Its {waiting} waiting lines never start; they are reported as cancelled and not charged.",
        f"Its {running} running lines finish and are charged.",
        f"Its {done} completed lines stay in its output file.",
    ]
