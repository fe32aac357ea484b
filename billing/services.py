"""Billing writes for single requests and for finance: holds, settlements and releases (each
booked through billing.booking, the code the gateway batches through), an operator's forced release,
adjustments and price changes. (Crash leftovers are released by liveness: billing.heartbeats.)

Lifecycle of a request: `budget_hold` at admission → `charge_settle` on completion (also for the
tokens an abandoned stream already produced) or `hold_release` when it is refused, times out,
is cancelled or fails upstream. All three are idempotent per request id: the ledger has at most
one hold, one charge and one release per request (a unique constraint backs what booking decides
under the budget rows' locks), and a settlement writes its release too.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import cast

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from billing.alerts import alerts_record
from billing.booking import book, book_one
from billing.booking_asks import FORCED_REASON, Charged, HoldAsk, ReleaseAsk, SettleAsk
from billing.budgets import budget_move, budgets_for, budgets_lock, tenant_get
from billing.errors import BillingError, UnknownClass
from billing.inflight import HeldEntry
from billing.models import Budget, LedgerEntry, PriceVersion
from billing.money import money
from billing.price_versions import price_set
from scheduling.models import PriorityClass
from scheduling.prices import price_factor_check

logger = logging.getLogger("fairgate.billing")
Kind = LedgerEntry.Kind


def budget_hold(
    *,
    tenant_slug: str,
    request_id: str,
    class_name: str,
    model: str,
    prompt_tokens: int,
    max_output_tokens: int,
    at: datetime | None = None,
    fallback: bool = False,
    owner: str = "",
    hold_cap: Decimal | None = None,
    key_prefix: str = "",
    job_id: str = "",
    key_creator: str = "",
) -> HeldEntry:
    """Hold the largest possible charge of a request; raises BudgetExhausted if it does not fit
    (with `fallback`, a tenant configured for it gets the first cheaper class that fits instead).
    `owner`: the beating process whose request it is (billing.heartbeats); without one, the hold is
    released by age if nothing ends it. ``key_prefix``, ``job_id``, ``key_creator``: who spends,
    recorded on its entries."""
    held = book_one(
        HoldAsk(
            request_id=request_id,
            tenant_slug=tenant_slug,
            class_name=class_name,
            model=model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max_output_tokens,
            at=at or timezone.now(),
            fallback=fallback,
            owner=owner,
            hold_cap=hold_cap,
            key_prefix=key_prefix,
            job_id=job_id,
            key_creator=key_creator,
        )
    )
    return cast(HeldEntry, held)  # book_one's result is typed object: for a hold, its HeldEntry


def charge_settle(
    *,
    request_id: str,
    backend_name: str,
    prompt_tokens: int,
    completion_tokens: int,
    at: datetime | None = None,
) -> Decimal:
    """Turn the hold into the actual charge at the admission price, at most the hold; release the
    hold. Applied once. Returns the charge."""
    charged = book_one(
        SettleAsk(
            request_id=request_id,
            backend_name=backend_name,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            at=at or timezone.now(),
        )
    )
    return cast(Charged, charged).amount  # for a settlement, its Charged


def hold_release(*, request_id: str, reason: str) -> bool:
    """No charge: refused, queue timeout, cancelled before dispatch, upstream failure. Idempotent;
    returns whether a hold was released now."""
    released = book_one(ReleaseAsk(request_id=request_id, reason=reason, at=timezone.now()))
    return cast(bool, released)  # for a release, whether it released a hold


def holds_release_forced(*, older_than: timedelta, now: datetime | None = None, reason: str = FORCED_REASON) -> int:
    """An operator's release: every open hold older than `older_than`, whether or not its owner
    lives (a request still running is then charged only what its budget has left when it ends).
    The sweeps release by liveness instead (billing.heartbeats). Returns how many."""
    cutoff = (now or timezone.now()) - older_than
    released = LedgerEntry.objects.filter(kind=Kind.RELEASE).values("request_id")
    open_holds = (
        LedgerEntry.objects.filter(kind=Kind.HOLD, at__lt=cutoff)
        .exclude(request_id__in=released)
        .order_by("pk")
        .values_list("request_id", flat=True)
    )
    at = timezone.now()
    results = book([ReleaseAsk(request_id=rid, reason=reason, at=at) for rid in open_holds])  # in batches
    for failed in (r for r in results if isinstance(r, BaseException)):
        logger.error("could not release a hold: %s", failed)
    count = sum(r is True for r in results)
    if count:
        logger.warning("released %s open holds older than %s, whoever owned them (%s)", count, older_than, reason)
    return count


def _move_locked(locked: list[Budget], *, spent_delta: Decimal) -> None:
    for budget in locked:  # primary-key order, as locked
        crossed = budget_move(budget, spent_delta=spent_delta)
        if crossed:
            alerts_record(budget=budget, thresholds_pct=crossed)


def ledger_adjust(
    *,
    tenant_slug: str,
    amount: Decimal,
    reason: str,
    author: str,
    at: datetime | None = None,
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
            kind=Kind.ADJUSTMENT,
            at=at,
            tenant=tenant,
            budget=budgets.year,
            month_budget=budgets.month,
            amount=amount,
            reason=reason,
            author=author,
        )
        _move_locked(locked, spent_delta=amount)
        audit_record(
            actor=author, action="adjust", entity="budget", key=budgets.year.label, field_name="spent", new=amount
        )
    return entry


def price_change(
    *,
    class_name: str,
    price_factor: Decimal,
    actor: str,
    effective_at: datetime | None = None,
    confirm: bool = False,
) -> PriceVersion:
    """A new price version, now or at a future time. Admitted requests keep the version they held,
    batch lines their batch's. Refused as every door refuses (scheduling.prices: PriceRefused, or
    ConfirmNeeded for a move of more than 2x without ``confirm``)."""
    now = timezone.now()
    with transaction.atomic():
        priority_class = PriorityClass.objects.filter(name=class_name).first()
        if priority_class is None:
            raise UnknownClass(f"no class {class_name!r}")
        price_factor = price_factor_check(
            class_name=class_name, price_factor=price_factor, effective_at=effective_at, confirm=confirm, now=now
        )
        return price_set(
            priority_class=priority_class, price_factor=price_factor, actor=actor, effective_at=effective_at or now
        )
