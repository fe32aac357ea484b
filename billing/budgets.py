"""Budget rows: found or created lazily, moved by exact 6-place deltas, never below zero.

On the hot path rows move by single UPDATE statements (built here, run by billing.writes) in
primary-key order (the year row is created before its month rows), with no other locks: a hold
is a conditional UPDATE per row (`... WHERE limit IS NULL OR limit >= spent + held +
amount`), which locks the row and re-checks the condition on the latest committed values, so
concurrent holds at a budget's edge never take it below zero. The limit is read from the tenant
(or its monthly cap) in the same statement, so a changed budget applies to the next hold.
Adjustments lock their rows with SELECT ... FOR UPDATE in the same order and compute new values
in Python. On SQLite ROUND(…, 6) keeps the float arithmetic on the exact 6-place value, and
IMMEDIATE transactions serialise writers.

Which rows a tenant's hold goes to (its year budget and, with a monthly cap, the month's) is
cached per fiscal period (billing.cache); the UPDATE names the tenant too, so a stale id moves
nothing and the caller retries with fresh ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction

from gateway.models import Tenant

from billing.cache import TtlCache
from billing.errors import BudgetExhausted, UnknownTenant
from billing.models import Budget, TenantBilling
from billing.periods import Period, month_period_at, year_period_at
from billing.writes import Move

ALERT_THRESHOLDS_PCT = (80, 100)


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


def _budget_get(*, tenant: Tenant, kind: str, period: Period, limit: Decimal | None,
                found: Budget | None = None) -> Budget:
    budget = found or Budget.objects.filter(tenant=tenant, kind=kind, starts_at=period.starts_at).first()
    if budget is None:
        try:
            with transaction.atomic():
                budget = Budget.objects.create(
                    tenant=tenant, kind=kind, fiscal_year=period.fiscal_year,
                    starts_at=period.starts_at, ends_at=period.ends_at, limit=limit,
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
    year = _budget_get(tenant=tenant, kind=Budget.Kind.YEAR, period=year_period_at(at), limit=tenant.annual_budget,
                       found=year)
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
    """Apply deltas to a locked row; returns the alert thresholds (percent) that `spent` crossed."""
    old_spent = budget.spent
    budget.spent = old_spent + spent_delta
    budget.held = budget.held + held_delta  # a negative result violates a CHECK: a bug, not a state
    Budget.objects.filter(pk=budget.pk).update(spent=budget.spent, held=budget.held)
    return thresholds_crossed(limit=budget.limit, old_spent=old_spent, new_spent=budget.spent)


def thresholds_crossed(*, limit: Decimal | None, old_spent: Decimal, new_spent: Decimal) -> list[int]:
    if limit is None or limit <= 0:
        return []
    return [pct for pct in ALERT_THRESHOLDS_PCT if old_spent < limit * pct / 100 <= new_spent]


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
    key = (tenant_slug, year_period_at(at).starts_at, month_period_at(at).starts_at)
    return _scopes.get(key, lambda: _load_scope(tenant_slug, at), refresh=refresh)


def _limit_now_sql(ref: BudgetRef) -> str:
    """The row's limit as configured right now: the tenant's annual budget or its monthly cap."""
    if ref.kind == Budget.Kind.YEAR:
        return f"(SELECT annual_budget FROM {Tenant._meta.db_table} WHERE id = %(tenant_id)s)"
    return f"(SELECT monthly_cap FROM {TenantBilling._meta.db_table} WHERE tenant_id = %(tenant_id)s)"


def hold_moves(scope: BudgetScope, *, amount: Decimal, unless: tuple[str, dict] | None = None) -> list[Move]:
    """The conditional UPDATEs of a hold, one per row in primary-key order: add `amount` to `held`
    only where it fits under the limit configured now (and refresh the row's copy of that limit).
    `unless` (an SQL condition and its params), checked by the first one, refuses the hold when
    an assumption the caller cached no longer holds."""
    moves = []
    for ref in scope.refs:
        condition, condition_params = unless if unless and not moves else ("1 = 0", {})
        limit_now = _limit_now_sql(ref)
        sql = (
            f'UPDATE {Budget._meta.db_table} SET held = ROUND(held + %(amount)s, 6), "limit" = {limit_now} '
            f"WHERE id = %(budget_id)s AND tenant_id = %(tenant_id)s "
            f"AND ({limit_now} IS NULL OR {limit_now} >= ROUND(spent + held + %(amount)s, 6)) AND NOT ({condition})"
        )
        params = {"amount": amount, "budget_id": ref.pk, "tenant_id": ref.tenant_id, **condition_params}
        moves.append(Move(sql, params))
    return moves


def budget_exhausted(ref: BudgetRef, *, amount: Decimal, currency: str) -> BudgetExhausted:
    """The refusal, naming the budget and what remains under the limit configured now."""
    budget = Budget.objects.select_related("tenant__billing").get(pk=ref.pk)
    if budget.kind == Budget.Kind.YEAR:
        budget.limit = budget.tenant.annual_budget
    else:
        settings_row = billing_of(budget.tenant)
        budget.limit = None if settings_row is None else settings_row.monthly_cap
    remaining = budget.remaining  # None only if the limit was lifted meanwhile: the caller's race
    return BudgetExhausted(budget.label, max(remaining or Decimal(0), Decimal(0)), amount, currency)
