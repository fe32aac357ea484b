"""Budget rows: found or created lazily, locked in primary-key order, never below zero.

Holds, settlements and releases lock and move their rows in billing.booking; adjustments lock
them here (`budgets_lock`, the same order) and move them with `budget_move`. The limit a hold
is checked against is read from the tenant (or its monthly cap) under the lock, so a changed
budget applies to the next hold; the row keeps a copy of it for reports.

Which rows a tenant's hold goes to (its year budget and, with a monthly cap, the month's) is
cached per fiscal period (billing.cache); booking checks the locked rows still belong to the
tenant and re-reads the ids if not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal

from django.db import IntegrityError, transaction

from billing.cache import TtlCache
from billing.errors import UnknownTenant
from billing.models import Budget, TenantBilling
from billing.periods import Period, month_period_at, period_key, year_period_at
from tenants.models import Tenant

ALERT_THRESHOLDS_PCT = (50, 80, 100)  # a tenant's budgets alert at these unless its billing settings say others


@dataclass(frozen=True)
class TenantBudgets:
    tenant: Tenant
    year: Budget
    month: Budget | None

    @property
    def ids(self) -> list[int]:
        return [b.pk for b in (self.year, self.month) if b is not None]


def tenant_get(*, tenant_slug: str) -> Tenant:
    tenant = Tenant.objects.select_related("billing").filter(slug=tenant_slug).first()
    if tenant is None:
        raise UnknownTenant(f"no tenant {tenant_slug!r}")
    return tenant


def billing_of(tenant: Tenant) -> TenantBilling | None:
    try:
        return tenant.billing
    except TenantBilling.DoesNotExist:
        return None


def _budget_get(
    *, tenant: Tenant, kind: str, period: Period, limit: Decimal | None, found: Budget | None = None
) -> Budget:
    budget = found or Budget.objects.filter(tenant=tenant, kind=kind, starts_at=period.starts_at).first()
    if budget is None:
        try:
            with transaction.atomic():
                budget = Budget.objects.create(
                    tenant=tenant,
                    kind=kind,
                    fiscal_year=period.fiscal_year,
                    starts_at=period.starts_at,
                    ends_at=period.ends_at,
                    limit=limit,
                )
        except IntegrityError:  # created concurrently
            budget = Budget.objects.get(tenant=tenant, kind=kind, starts_at=period.starts_at)
    elif budget.limit != limit:  # the tenant's budget or cap was changed since
        Budget.objects.filter(pk=budget.pk).update(limit=limit)
        budget.limit = limit
    budget.tenant = tenant
    return budget


def budgets_for(*, tenant: Tenant, at: datetime, year: Budget | None = None) -> TenantBudgets:
    """The tenant's fiscal-year budget at `at` and, if it has a monthly cap, the month's."""
    year = _budget_get(
        tenant=tenant, kind=Budget.Kind.YEAR, period=year_period_at(at), limit=tenant.annual_budget, found=year
    )
    settings_row = billing_of(tenant)
    month = None
    if settings_row is not None and settings_row.monthly_cap is not None:
        month = _budget_get(
            tenant=tenant, kind=Budget.Kind.MONTH, period=month_period_at(at), limit=settings_row.monthly_cap
        )
    return TenantBudgets(tenant=tenant, year=year, month=month)


def budgets_for_slug(*, tenant_slug: str, at: datetime) -> TenantBudgets:
    """As budgets_for, reading tenant, settings and year budget in one query when the budget exists."""
    year = (
        Budget.objects.select_related("tenant__billing")
        .filter(tenant__slug=tenant_slug, kind=Budget.Kind.YEAR, starts_at=year_period_at(at).starts_at)
        .first()
    )
    if year is None:
        return budgets_for(tenant=tenant_get(tenant_slug=tenant_slug), at=at)
    return budgets_for(tenant=year.tenant, at=at, year=year)


def budgets_lock(ids: list[int]) -> list[Budget]:
    """Lock the rows in primary-key order (call inside transaction.atomic)."""
    return list(Budget.objects.select_for_update().select_related("tenant").filter(pk__in=ids).order_by("pk"))


def budget_move(budget: Budget, *, spent_delta: Decimal = Decimal(0), held_delta: Decimal = Decimal(0)) -> list[int]:
    """Apply deltas to a locked row; returns the whole percents of its limit that `spent` crossed."""
    old_spent = budget.spent
    budget.spent = old_spent + spent_delta
    budget.held = budget.held + held_delta  # a negative result violates a CHECK: a bug, not a state
    Budget.objects.filter(pk=budget.pk).update(spent=budget.spent, held=budget.held)
    return thresholds_crossed(limit=budget.limit, old_spent=old_spent, new_spent=budget.spent)


def thresholds_crossed(*, limit: Decimal | None, old_spent: Decimal, new_spent: Decimal) -> list[int]:
    """Every whole percent p (1-100) of ``limit`` with old_spent < p % <= new_spent; the alerts keep
    the budget's own thresholds among them (`alert_thresholds`, billing.alerts)."""
    if limit is None or limit <= 0 or new_spent <= old_spent:
        return []
    low = int((old_spent * 100 / limit).to_integral_value(rounding=ROUND_FLOOR)) + 1
    high = min(int((new_spent * 100 / limit).to_integral_value(rounding=ROUND_FLOOR)), 100)
    return list(range(max(low, 1), high + 1))


def alert_thresholds(row: TenantBilling | None) -> tuple[int, ...]:
    """The percents of its limit at which a tenant's budgets alert."""
    return alert_at(None if row is None else row.alert_thresholds_pct)


def alert_at(configured: object) -> tuple[int, ...]:
    """TenantBilling.alert_thresholds_pct as stored (a list, its JSON text, or None) → the
    thresholds, the defaults where none are set."""
    if isinstance(configured, str):
        configured = json.loads(configured)
    if not configured or not isinstance(configured, list):
        return ALERT_THRESHOLDS_PCT
    return tuple(sorted({p for p in configured if isinstance(p, int)}))


@dataclass(frozen=True)
class BudgetRef:
    pk: int
    tenant_id: int
    kind: str


@dataclass(frozen=True)
class BudgetScope:
    """Where a tenant's holds go in one fiscal period: its year budget and maybe a month budget."""

    tenant_id: int
    refs: tuple[BudgetRef, ...]  # primary-key order, the order rows are moved in

    @property
    def year_id(self) -> int:
        return next(r.pk for r in self.refs if r.kind == Budget.Kind.YEAR)

    @property
    def month_id(self) -> int | None:
        return next((r.pk for r in self.refs if r.kind == Budget.Kind.MONTH), None)


_scopes: TtlCache[BudgetScope] = TtlCache()


def _load_scope(tenant_slug: str, at: datetime) -> BudgetScope:
    budgets = budgets_for_slug(tenant_slug=tenant_slug, at=at)
    rows = sorted((b for b in (budgets.year, budgets.month) if b is not None), key=lambda b: b.pk)
    return BudgetScope(budgets.tenant.pk, tuple(BudgetRef(b.pk, b.tenant_id, b.kind) for b in rows))


def budget_scope(*, tenant_slug: str, at: datetime, refresh: bool = False) -> BudgetScope:
    """The tenant's budget rows at `at`, created if need be (cached per fiscal period)."""
    key = (tenant_slug, period_key(at))
    return _scopes.get(key, lambda: _load_scope(tenant_slug, at), refresh=refresh)
