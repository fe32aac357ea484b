"""The publisher's database reads (synchronous; it calls them through ``sync_to_async``)."""

from __future__ import annotations

from batches.service import batch_cards
from console import selectors
from console.formatting import ended_because
from tenants.models import Tenant


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


def batches_for(tenant_ids_: list[int]) -> dict[int, list[dict]]:
    """Each tenant's batch cards (batches.service.batch_cards), with why its lines failed in words."""
    cards = batch_cards(tenant_ids_)
    for tenant_cards in cards.values():
        for card in tenant_cards:
            for row in card.get("failed_by_reason", []) + card.get("failures", []):
                row["because"] = ended_because(row["reason"])
    return cards
