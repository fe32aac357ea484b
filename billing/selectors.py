"""Billing reads: the budget fallback class, ledger verification, and who may see which tenant."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from billing.budgets import billing_of, budgets_for, tenant_get
from billing.models import Budget, LedgerEntry
from billing.money import ZERO, MoneySum, or_zero
from billing.price_versions import classes_with_price
from billing.pricing import charge_of, price_version_at, upper_bound_base_cost
from scheduling.models import PriorityClass
from scheduling.selectors import tenant_spec
from tenants.models import Tenant

Kind = LedgerEntry.Kind
# How each kind of entry moves a budget's denormalised columns.
EFFECTS = {Kind.HOLD: ("held", 1), Kind.RELEASE: ("held", -1), Kind.CHARGE: ("spent", 1), Kind.ADJUSTMENT: ("spent", 1)}


def fallback_classes(*, tenant_slug: str, class_name: str, at: datetime) -> list[str]:
    """For a tenant configured to fall back (TenantBilling.fallback_on_exhausted): the classes
    below `class_name` (lower priority, lower price factor, allowed to the tenant) in the order
    they are tried, the most expensive first. Empty: no fallback, refuse with 402."""
    tenant = tenant_get(tenant_slug=tenant_slug)
    row = billing_of(tenant)
    declared = PriorityClass.objects.filter(name=class_name).first()
    if row is None or not row.fallback_on_exhausted or declared is None:
        return []
    declared_factor = price_version_at(class_name=class_name, at=at).price_factor
    allowed = set(tenant_spec(tenant).classes)
    candidates = sorted(
        (
            c
            for c in classes_with_price(at=at)
            if c.price_factor is not None
            and c.level > declared.level
            and c.price_factor < declared_factor
            and (not allowed or c.name in allowed)
        ),
        key=lambda c: (-c.price_factor, c.level),
    )
    return [c.name for c in candidates]


def _remaining(tenant_slug: str, at: datetime) -> list[Decimal]:
    """What each of the tenant's limited budgets (year, month) has left now."""
    budgets = budgets_for(tenant=tenant_get(tenant_slug=tenant_slug), at=at)
    return [b.remaining for b in (budgets.year, budgets.month) if b is not None and b.remaining is not None]


def budget_fallback_class(
    *,
    tenant_slug: str,
    class_name: str,
    model: str,
    prompt_tokens: int,
    max_output_tokens: int,
    at: datetime | None = None,
) -> str | None:
    """The first of `fallback_classes` whose hold fits the remaining budget(s) now, or None.
    A read without locks (what a hold with `fallback=True` decides under lock)."""
    at = at or timezone.now()
    names = fallback_classes(tenant_slug=tenant_slug, class_name=class_name, at=at)
    if not names:
        return None
    base = upper_bound_base_cost(model=model, prompt_tokens=prompt_tokens, completion_tokens=max_output_tokens)
    remaining = _remaining(tenant_slug, at)
    for name in names:
        amount = charge_of(base_cost=base, factor=price_version_at(class_name=name, at=at).price_factor)
        if all(r >= amount for r in remaining):
            return name
    return None


def hold_terms(
    *, tenant_slug: str, class_name: str, at: datetime | None = None
) -> tuple[Decimal | None, Decimal, Decimal]:
    """For a forecast of holds, read without locks: the tenant's smallest remaining budget (None:
    no limit), the class's price factor, and the lowest factor its holds may fall back to (the
    class's own when the tenant does not fall back)."""
    at = at or timezone.now()
    remaining = _remaining(tenant_slug, at)
    factor = price_version_at(class_name=class_name, at=at).price_factor
    lower = [
        price_version_at(class_name=name, at=at).price_factor
        for name in fallback_classes(tenant_slug=tenant_slug, class_name=class_name, at=at)
    ]
    return (min(remaining) if remaining else None), factor, min([factor, *lower])


@dataclass(frozen=True)
class Mismatch:
    budget_id: int
    label: str
    column: str
    stored: Decimal
    ledger: Decimal

    def __str__(self) -> str:
        return f"{self.label} (budget {self.budget_id}): {self.column} is {self.stored}, the ledger says {self.ledger}"


def ledger_balances() -> dict[int, dict[str, Decimal]]:
    """Every budget's spent and held, recomputed from the ledger alone."""
    balances: dict[int, dict[str, Decimal]] = defaultdict(lambda: {"spent": ZERO, "held": ZERO})
    for key in ("budget_id", "month_budget_id"):
        rows = (
            LedgerEntry.objects.filter(**{f"{key}__isnull": False})
            .values(key, "kind")
            .annotate(total=MoneySum("amount"))
            .order_by()
        )
        for row in rows:
            column, sign = EFFECTS[row["kind"]]
            balances[row[key]][column] += sign * or_zero(row["total"])
    return balances


def ledger_mismatches() -> list[Mismatch]:
    balances = ledger_balances()
    found = []
    for budget in Budget.objects.select_related("tenant").order_by("pk"):
        expected = balances.get(budget.pk, {"spent": ZERO, "held": ZERO})
        for column in ("spent", "held"):
            stored = getattr(budget, column)
            if stored != expected[column]:
                found.append(Mismatch(budget.pk, budget.label, column, stored, expected[column]))
    return found


def tenants_visible(*, user) -> QuerySet[Tenant]:
    """Finance and admin users see every tenant; anyone else only their own (or none)."""
    if getattr(user, "sees_all_tenants", False):  # anonymous users have no such attribute
        return Tenant.objects.all()
    if getattr(user, "tenant_id", None) is None:
        return Tenant.objects.none()
    return Tenant.objects.filter(pk=user.tenant_id)
