"""The publisher's database reads (synchronous; it calls them through ``sync_to_async``)."""

from __future__ import annotations

from batches.service import batch_cards
from console import selectors
from gateway.api import DowngradeEvent
from tenants.models import Tenant

DOWNGRADE_BATCH = 500


def tenant_ids(slugs: list[str]) -> dict[str, int]:
    return dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "pk"))


def tenant_slugs(ids: list[int]) -> dict[int, str]:
    return dict(Tenant.objects.filter(pk__in=ids).values_list("pk", "slug"))


def holds_for(wanted: dict[str, tuple[int, list[str]]]) -> dict[str, dict[str, str]]:
    return {
        slug: selectors.hold_amounts(tenant_id=tenant_id, slug=slug, request_ids=ids)
        for slug, (tenant_id, ids) in wanted.items()
    }


def budgets_for(tenant_ids_: list[int]) -> dict[int, dict]:
    return {t.pk: selectors.budget_of(tenant=t) for t in Tenant.objects.filter(pk__in=tenant_ids_)}


def downgrades_after(cursor: int | None) -> tuple[int | None, list[tuple[int, dict]]]:
    """Committed downgrade events after ``cursor`` (None: start from the newest, return none)."""
    if cursor is None:
        return DowngradeEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0, []
    rows = list(DowngradeEvent.objects.filter(pk__gt=cursor).order_by("pk")[:DOWNGRADE_BATCH])
    if not rows:
        return cursor, []
    return rows[-1].pk, [(e.tenant_id, selectors.downgrade_row(e)) for e in rows]


def batches_for(tenant_ids_: list[int]) -> dict[int, list[dict]]:
    """Each tenant's batch cards (batches.service.batch_cards)."""
    return batch_cards(tenant_ids_)
