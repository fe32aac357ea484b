"""Billing writes. Each public function is one short transaction (sync; the gateway calls them
through sync_to_async) and every budget move is matched by ledger entries in that transaction.

Lifecycle of a request: `budget_hold` at admission → `charge_settle` on completion (also for the
tokens an abandoned stream already produced) or `hold_release` when it is refused, times out,
is cancelled or fails upstream. All three are idempotent per request id: the ledger has at most
one hold, one charge and one release per request (a unique constraint), and a settlement writes
its release too, so that constraint alone decides which of a racing settle/release wins.

The hot path reads nothing in the common case: prices, backends and budget ids come from
billing.cache, a request's hold from billing.inflight. Its transaction inserts the ledger rows
first (a repeated call stops there) and then moves the budget rows in primary-key order, so
every writer takes the same locks in the same order.
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
from billing.budgets import budget_exhausted, budget_move, budget_scope, budgets_for, budgets_lock, hold_moves
from billing.budgets import tenant_get, thresholds_crossed
from billing.errors import BillingError, BudgetExhausted, HoldNotFound, UnknownClass
from billing.inflight import HeldEntry, held_forget, held_get, held_remember
from billing.models import Budget, LedgerEntry
from billing.money import ZERO, money
from billing.pricing import backend_prices, charge_of, newer_price_sql, price_version_at, upper_bound_base_cost
from billing.writes import Move, Moved, RowNotMoved, atomic_for, move_by, write

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


def _hold_result(held: HeldEntry) -> HoldResult:
    return HoldResult(
        amount=held.amount, price_version_id=held.price_version_id, factor=held.factor,
        budget_id=held.budget_id, class_name=held.class_name, request_id=held.request_id,
    )


def _check_tokens(*counts: int) -> None:
    if any(not isinstance(n, int) or n < 0 for n in counts):
        raise BillingError(f"token counts are non-negative integers, not {counts}")


class _CacheMaybeStale(Exception):
    """A hold was refused on cached facts: decide again on fresh ones."""


def _entry(held: HeldEntry, *, kind: str, amount: Decimal, at: datetime, **fields) -> LedgerEntry:
    return LedgerEntry(
        kind=kind, at=at, amount=amount, tenant_id=held.tenant_id, budget_id=held.budget_id,
        month_budget_id=held.month_budget_id, request_id=held.request_id, class_name=held.class_name,
        price_version_id=held.price_version_id, model=held.model, factor=held.factor, **fields,
    )


def _hold_once(*, tenant_slug: str, request_id: str, class_name: str, model: str, prompt_tokens: int,
               max_output_tokens: int, at: datetime, fresh: bool) -> HeldEntry:
    scope = budget_scope(tenant_slug=tenant_slug, at=at, refresh=fresh)
    version = price_version_at(class_name=class_name, at=at, refresh=fresh)
    base = upper_bound_base_cost(model=model, prompt_tokens=prompt_tokens, completion_tokens=max_output_tokens,
                                 refresh=fresh)
    held = HeldEntry(
        request_id=request_id, tenant_id=scope.tenant_id, budget_id=scope.year_id, month_budget_id=scope.month_id,
        class_name=class_name, price_version_id=version.pk, model=model, factor=version.price_factor,
        amount=charge_of(base_cost=base, factor=version.price_factor),
    )
    entry = _entry(held, kind=Kind.HOLD, amount=held.amount, at=at, prompt_tokens=prompt_tokens,
                   completion_tokens=max_output_tokens, base_cost=money(base))
    # A cached price version must still be the one in force: the hold's UPDATE checks it.
    moves = hold_moves(scope, amount=held.amount, unless=None if fresh else newer_price_sql(version, at=at))
    try:
        with atomic_for(moves):
            write(moves, [entry])
    except RowNotMoved as refused:
        if not fresh:
            raise _CacheMaybeStale from None
        ref = scope.refs[refused.index]
        raise budget_exhausted(ref, amount=held.amount, currency=settings.FAIRGATE_CURRENCY) from None
    return held


def budget_hold(
    *, tenant_slug: str, request_id: str, class_name: str, model: str, prompt_tokens: int,
    max_output_tokens: int, at: datetime | None = None,
) -> HoldResult:
    """Hold the largest possible charge of a request; raises BudgetExhausted if it does not fit."""
    if not request_id:
        raise BillingError("a hold needs a request id")
    _check_tokens(prompt_tokens, max_output_tokens)
    args = dict(tenant_slug=tenant_slug, request_id=request_id, class_name=class_name, model=model,
                prompt_tokens=prompt_tokens, max_output_tokens=max_output_tokens, at=at or timezone.now())
    try:
        try:
            held = _hold_once(**args, fresh=False)
        except _CacheMaybeStale:  # refused: only fresh prices, limits and budget ids may refuse
            held = _hold_once(**args, fresh=True)
    except (IntegrityError, BudgetExhausted):  # the budget moves first: a retry may not fit any more
        existing = held_get(request_id)
        if existing is None:
            raise
        return _hold_result(existing)  # a retried admission: the first hold stands
    transaction.on_commit(lambda: held_remember(held))  # only a committed hold may be remembered
    return _hold_result(held)


def _moves(held: HeldEntry, *, spent_delta: Decimal = ZERO, held_delta: Decimal = ZERO) -> list[Move]:
    return [move_by(pk, spent_delta=spent_delta, held_delta=held_delta) for pk in sorted(held.budget_ids)]


def _alert_crossings(held: HeldEntry, moved: list[Moved], *, spent_delta: Decimal) -> None:
    """Record the 80 %/100 % crossings of the rows just moved (delivered after commit)."""
    for pk, row in zip(sorted(held.budget_ids), moved):
        crossed = thresholds_crossed(limit=row.limit, old_spent=row.spent - spent_delta, new_spent=row.spent)
        if crossed:
            alerts_record(budget=Budget.objects.select_related("tenant").get(pk=pk), thresholds_pct=crossed)


def _move_locked(locked: list[Budget], *, spent_delta: Decimal) -> None:
    for budget in locked:  # primary-key order, as locked
        crossed = budget_move(budget, spent_delta=spent_delta)
        if crossed:
            alerts_record(budget=budget, thresholds_pct=crossed)


def _outcomes(request_id: str) -> dict[str, tuple[Decimal, str]]:
    """The request's charge and release entries so far: kind -> (amount, reason)."""
    rows = LedgerEntry.objects.filter(request_id=request_id, kind__in=[Kind.CHARGE, Kind.RELEASE])
    return {kind: (amount, reason) for kind, amount, reason in rows.values_list("kind", "amount", "reason")}


def _charge(held: HeldEntry, *, release: bool, charge: Decimal, fields: dict, at: datetime) -> None:
    """Book the charge (and release the hold, unless already released): one transaction. The
    ledger's unique (request_id, kind) raises IntegrityError if either was booked before."""
    entries = [_entry(held, kind=Kind.RELEASE, amount=held.amount, at=at, reason="settled")] if release else []
    entries.append(_entry(held, kind=Kind.CHARGE, amount=charge, at=at, **fields))
    moves = _moves(held, spent_delta=charge, held_delta=-held.amount if release else ZERO)
    with transaction.atomic():  # always: the alerts are recorded in it
        moved = write(moves, entries)
        _alert_crossings(held, moved, spent_delta=charge)


def charge_settle(
    *, request_id: str, backend_name: str, prompt_tokens: int, completion_tokens: int, at: datetime | None = None,
) -> Decimal:
    """Turn the hold into the actual charge at the admission price; release the hold. Applied once."""
    _check_tokens(prompt_tokens, completion_tokens)
    at = at or timezone.now()
    held = held_get(request_id)
    if held is None:
        raise HoldNotFound(f"request {request_id!r} has no hold")
    base = backend_prices(backend_name=backend_name).base_cost(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
    )
    charge = charge_of(base_cost=base, factor=held.factor)
    fields = dict(backend_name=backend_name, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                  base_cost=money(base), overrun=max(charge - held.amount, ZERO))
    try:
        _charge(held, release=True, charge=charge, fields=fields, at=at)
    except IntegrityError as conflict:  # charged or released before (the unique constraint says which)
        charged = _settle_after_conflict(held, charge=charge, fields=fields, at=at, conflict=conflict)
        if charged is not None:
            return charged
    held_forget(request_id)
    if charge > held.amount:
        logger.warning("request %s overran its hold: charged %s, held %s", request_id, charge, held.amount)
    return charge


def _settle_after_conflict(held: HeldEntry, *, charge: Decimal, fields: dict, at: datetime,
                           conflict: IntegrityError) -> Decimal | None:
    """The amount to return for a settlement already decided, or None once `charge` is booked now
    (the stale sweep released the hold: what was consumed is still charged, once)."""
    held_forget(held.request_id)
    done = _outcomes(held.request_id)
    if Kind.CHARGE in done:
        return done[Kind.CHARGE][0]  # a retried settlement charges once
    if Kind.RELEASE not in done:
        raise conflict  # not a repeat: a real integrity problem
    if done[Kind.RELEASE][1] != STALE_REASON:
        logger.warning("settlement of %s ignored: released (%s) before", held.request_id, done[Kind.RELEASE][1])
        return ZERO
    try:
        _charge(held, release=False, charge=charge, fields=fields, at=at)
    except IntegrityError:  # another late settlement of it won
        done = _outcomes(held.request_id)
        if Kind.CHARGE in done:
            return done[Kind.CHARGE][0]
        raise
    return None


def _release(*, request_id: str, reason: str, at: datetime | None = None) -> bool:
    held = held_get(request_id)
    if held is None:
        return False  # refused before anything was held
    moves = _moves(held, held_delta=-held.amount)
    try:
        with atomic_for(moves):
            write(moves, [_entry(held, kind=Kind.RELEASE, amount=held.amount, at=at or timezone.now(), reason=reason)])
    except IntegrityError:  # released before, or settled (a settlement writes a release too)
        if Kind.RELEASE not in _outcomes(request_id):
            raise
        return False
    finally:
        held_forget(request_id)
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
        _move_locked(locked, spent_delta=amount)
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
