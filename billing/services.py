"""Billing writes. Each public function is one short transaction (sync; the gateway calls them
through sync_to_async) and every budget move is matched by ledger entries in that transaction.

Lifecycle of a request: `budget_hold` at admission → `charge_settle` on completion (also for the
tokens an abandoned stream already produced) or `hold_release` when it is refused, times out,
is cancelled or fails upstream. All three are idempotent per request id: the ledger has at most
one hold, one charge and one release per request (a unique constraint backs this up).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduling.models import PriceVersion, PriorityClass
from scheduling.services import audit_record, price_set

from billing.alerts import alerts_record
from billing.budgets import budget_move, budgets_for, budgets_for_slug, budgets_hold, budgets_lock, tenant_get
from billing.errors import BillingError, HoldNotFound, UnknownClass
from billing.models import Budget, LedgerEntry
from billing.money import ZERO, money
from billing.pricing import backend_prices, charge_of, price_version_at, upper_bound_base_cost

logger = logging.getLogger("fairgate.billing")
Kind = LedgerEntry.Kind
STALE_REASON = "stale"  # released by the sweep: a late settlement still charges what was consumed


@dataclass(frozen=True)
class HoldResult:
    amount: Decimal
    price_version_id: int
    factor: Decimal
    budget_id: int
    class_name: str
    request_id: str


def _hold_result(entry: LedgerEntry) -> HoldResult:
    return HoldResult(
        amount=entry.amount, price_version_id=entry.price_version_id, factor=entry.factor,
        budget_id=entry.budget_id, class_name=entry.class_name, request_id=entry.request_id,
    )


def _hold_entry(request_id: str) -> LedgerEntry | None:
    return LedgerEntry.objects.filter(request_id=request_id, kind=Kind.HOLD).first()


def _check_tokens(*counts: int) -> None:
    if any(not isinstance(n, int) or n < 0 for n in counts):
        raise BillingError(f"token counts are non-negative integers, not {counts}")


def _move_all(locked: list[Budget], *, spent_delta: Decimal = ZERO, held_delta: Decimal = ZERO) -> None:
    for budget in locked:  # primary-key order, as locked
        crossed = budget_move(budget, spent_delta=spent_delta, held_delta=held_delta)
        if crossed:
            alerts_record(budget=budget, thresholds_pct=crossed)


def budget_hold(
    *, tenant_slug: str, request_id: str, class_name: str, model: str, prompt_tokens: int,
    max_output_tokens: int, at: datetime | None = None,
) -> HoldResult:
    """Hold the largest possible charge of a request; raises BudgetExhausted if it does not fit."""
    if not request_id:
        raise BillingError("a hold needs a request id")
    _check_tokens(prompt_tokens, max_output_tokens)
    at = at or timezone.now()
    budgets = budgets_for_slug(tenant_slug=tenant_slug, at=at)
    tenant = budgets.tenant
    version = price_version_at(class_name=class_name, at=at)
    base = upper_bound_base_cost(model=model, prompt_tokens=prompt_tokens, completion_tokens=max_output_tokens)
    amount = charge_of(base_cost=base, factor=version.price_factor)
    try:
        with transaction.atomic():
            entry = LedgerEntry.objects.create(
                kind=Kind.HOLD, at=at, tenant=tenant, budget=budgets.year, month_budget=budgets.month,
                request_id=request_id, class_name=class_name, price_version=version, model=model,
                prompt_tokens=prompt_tokens, completion_tokens=max_output_tokens, base_cost=money(base),
                factor=version.price_factor, amount=amount,
            )
            budgets_hold(budgets, amount=amount, currency=settings.FAIRGATE_CURRENCY)
    except IntegrityError:
        existing = _hold_entry(request_id)
        if existing is None:
            raise
        return _hold_result(existing)  # a retried admission: the first hold stands
    return _hold_result(entry)


def charge_settle(
    *, request_id: str, backend_name: str, prompt_tokens: int, completion_tokens: int, at: datetime | None = None,
) -> Decimal:
    """Turn the hold into the actual charge at the admission price; release the hold. Applied once."""
    _check_tokens(prompt_tokens, completion_tokens)
    at = at or timezone.now()
    hold = _hold_entry(request_id)
    if hold is None:
        raise HoldNotFound(f"request {request_id!r} has no hold")
    base = backend_prices(backend_name=backend_name).base_cost(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
    )
    charge = charge_of(base_cost=base, factor=hold.factor)
    try:
        with transaction.atomic():
            locked = budgets_lock([i for i in (hold.budget_id, hold.month_budget_id) if i])
            done = {e.kind: e for e in LedgerEntry.objects.filter(request_id=request_id).exclude(kind=Kind.HOLD)}
            if Kind.CHARGE in done:
                return done[Kind.CHARGE].amount
            release = done.get(Kind.RELEASE)
            if release is not None and release.reason != STALE_REASON:
                logger.warning("settlement of %s ignored: released (%s) before", request_id, release.reason)
                return ZERO
            if release is None:
                _entry_from_hold(hold, kind=Kind.RELEASE, at=at, amount=hold.amount, reason="settled")
            _entry_from_hold(
                hold, kind=Kind.CHARGE, at=at, amount=charge, backend_name=backend_name,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, base_cost=money(base),
                overrun=max(charge - hold.amount, ZERO),
            )
            _move_all(locked, spent_delta=charge, held_delta=ZERO if release else -hold.amount)
    except IntegrityError:  # lost a unique (request_id, kind) race (the row locks make this a backstop)
        done = {e.kind: e for e in LedgerEntry.objects.filter(request_id=request_id).exclude(kind=Kind.HOLD)}
        if Kind.CHARGE in done:
            return done[Kind.CHARGE].amount
        if Kind.RELEASE in done and done[Kind.RELEASE].reason != STALE_REASON:
            return ZERO
        raise
    if charge > hold.amount:
        logger.warning("request %s overran its hold: charged %s, held %s", request_id, charge, hold.amount)
    return charge


def _entry_from_hold(hold: LedgerEntry, *, kind: str, at: datetime, amount: Decimal, **fields) -> LedgerEntry:
    return LedgerEntry.objects.create(
        kind=kind, at=at, tenant_id=hold.tenant_id, budget_id=hold.budget_id, month_budget_id=hold.month_budget_id,
        request_id=hold.request_id, class_name=hold.class_name, price_version_id=hold.price_version_id,
        model=hold.model, factor=hold.factor, amount=amount, **fields,
    )


def _release(*, request_id: str, reason: str, at: datetime | None = None) -> bool:
    hold = _hold_entry(request_id)
    if hold is None:
        return False  # refused before anything was held
    at = at or timezone.now()
    try:
        with transaction.atomic():
            locked = budgets_lock([i for i in (hold.budget_id, hold.month_budget_id) if i])
            kinds = set(LedgerEntry.objects.filter(request_id=request_id).values_list("kind", flat=True))
            if Kind.RELEASE in kinds or Kind.CHARGE in kinds:
                return False
            _entry_from_hold(hold, kind=Kind.RELEASE, at=at, amount=hold.amount, reason=reason)
            _move_all(locked, held_delta=-hold.amount)
    except IntegrityError:  # released concurrently
        return False
    return True


def hold_release(*, request_id: str, reason: str) -> None:
    """No charge: refused, queue timeout, cancelled before dispatch, upstream failure. Idempotent."""
    if not reason:
        raise BillingError("a release needs a reason")
    _release(request_id=request_id, reason=reason)


def holds_release_stale(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Release holds older than `older_than` with no release yet (crash leftovers); returns how many."""
    cutoff = (now or timezone.now()) - older_than
    released = LedgerEntry.objects.filter(kind=Kind.RELEASE).values("request_id")
    stale = (
        LedgerEntry.objects.filter(kind=Kind.HOLD, at__lt=cutoff)
        .exclude(request_id__in=released)
        .order_by("pk")
        .values_list("request_id", flat=True)
    )
    count = sum(_release(request_id=rid, reason=STALE_REASON) for rid in list(stale))
    if count:
        logger.warning("released %s stale holds older than %s", count, older_than)
    return count


def ledger_adjust(
    *, tenant_slug: str, amount: Decimal, reason: str, author: str, at: datetime | None = None,
) -> LedgerEntry:
    """A correction: positive charges more, negative credits. Books to the budget(s) in force at `at`."""
    if not reason.strip() or not author.strip():
        raise BillingError("an adjustment needs a reason and an author")
    amount = Decimal(amount)
    if amount == 0 or money(amount) != amount:
        raise BillingError("an adjustment is a non-zero amount with at most 6 decimal places")
    at = at or timezone.now()
    tenant = tenant_get(tenant_slug=tenant_slug)
    budgets = budgets_for(tenant=tenant, at=at)
    with transaction.atomic():
        locked = budgets_lock(budgets.ids)
        entry = LedgerEntry.objects.create(
            kind=Kind.ADJUSTMENT, at=at, tenant=tenant, budget=budgets.year, month_budget=budgets.month,
            amount=amount, reason=reason, author=author,
        )
        _move_all(locked, spent_delta=amount)
        audit_record(actor=author, action="adjust", entity="budget", key=budgets.year.label, field_name="spent",
                     new=amount)
    return entry


def price_change(
    *, class_name: str, price_factor: Decimal, actor: str, effective_at: datetime | None = None,
) -> PriceVersion:
    """A new price version, now or at a future time. Admitted requests keep the version they held."""
    now = timezone.now()
    price_factor = Decimal(price_factor)
    if price_factor < 0 or price_factor != price_factor.quantize(Decimal("0.0001")):
        raise BillingError("a price factor is >= 0 with at most 4 decimal places")
    if effective_at is not None and effective_at < now - timedelta(seconds=1):
        raise BillingError("a price change cannot take effect in the past")
    with transaction.atomic():
        priority_class = PriorityClass.objects.filter(name=class_name).first()
        if priority_class is None:
            raise UnknownClass(f"no class {class_name!r}")
        return price_set(priority_class=priority_class, price_factor=price_factor, actor=actor,
                         effective_at=effective_at or now)
