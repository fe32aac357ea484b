"""Deciding a booking (billing.booking) inside its transaction: each ask against the locked
budget rows and what the ledger already has of its request (applied once), in order."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings

from billing import statements
from billing.booking_asks import (
    LATE_SETTLEMENT_REASONS,
    MAX_ATTEMPTS,
    Booked,
    Charged,
    HoldAsk,
    ReleaseAsk,
    SettleAsk,
    attempt_key,
)
from billing.booking_plans import BookingPlan, fallbacks_priced
from billing.budgets import ALERT_THRESHOLDS_PCT, alert_at
from billing.errors import BillingError, BudgetExhausted, RequestIdInUse, RequestIdUsed
from billing.inflight import UNLIMITED, HeldEntry, held_get
from billing.models import Budget, LedgerEntry
from billing.money import ZERO, money
from billing.pricing import capped

log = logging.getLogger("fairgate.billing")
Kind = LedgerEntry.Kind

Done = dict[tuple[str, str], tuple[Decimal, str]]
Holds = dict[str, HeldEntry | None]  # None: in the ledger, not read yet


def _booked(
    held: HeldEntry,
    kind: str,
    amount: Decimal,
    at: datetime,
    *,
    backend_name: str = "",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    base_cost: Decimal = ZERO,
    unbilled: Decimal = ZERO,
    reason: str = "",
) -> Booked:
    """A ledger entry of ``held``'s request, made as the tuple it is (Booked's keywords and
    defaults cost the worker about 2 us an entry, three entries a request)."""
    return Booked._make(
        (
            kind,
            at,
            held.tenant_id,
            held.budget_id,
            held.month_budget_id,
            held.request_id,
            held.class_name,
            held.price_version_id,
            held.model,
            amount,
            held.factor,
            backend_name,
            prompt_tokens,
            completion_tokens,
            base_cost,
            ZERO,  # overrun
            unbilled,
            held.owner,
            reason,
            "",  # author
            held.key_prefix,
            held.job_id,
            held.key_creator,
        ),
    )


assert Booked._fields == (  # the order `_booked` writes
    *("kind", "at", "tenant_id", "budget_id", "month_budget_id", "request_id", "class_name", "price_version_id"),
    *("model", "amount", "factor", "backend_name", "prompt_tokens", "completion_tokens", "base_cost", "overrun"),
    *("unbilled", "owner", "reason", "author", "key_prefix", "job_id", "key_creator"),
)


@dataclass
class BudgetRow:
    """A locked budget row: balances as they move through the batch."""

    pk: int
    tenant_id: int
    limit: Decimal | None  # configured now
    stored_limit: Decimal | None
    spent: Decimal
    held: Decimal
    old_spent: Decimal = ZERO
    old_held: Decimal = ZERO
    alert_at: tuple[int, ...] = ALERT_THRESHOLDS_PCT  # the tenant's alert thresholds (percent)

    def fits(self, amount: Decimal) -> bool:
        return self.limit is None or self.limit >= self.spent + self.held + amount

    @property
    def dirty(self) -> bool:
        return (self.spent, self.held, self.stored_limit) != (self.old_spent, self.old_held, self.limit)


def money_read(value: Decimal | int | float) -> Decimal:
    """A money column as the driver returns it: PostgreSQL a Decimal, SQLite an int or the
    nearest float (exact to 6 places below 10^9)."""
    return money(Decimal(repr(value)) if isinstance(value, float) else Decimal(value))


def limit_read(value: Decimal | int | float | None) -> Decimal | None:
    """A limit column (None: no limit) as `_money` reads it."""
    return None if value is None else money_read(value)


def budget_rows(locked: Sequence[statements.Row]) -> dict[int, BudgetRow]:
    """The locked budget rows by primary key, as `statements.booking_reads` returns them."""
    rows = {}
    for pk, tenant_id, limit, stored, spent, held, thresholds in locked:
        spent, held = money_read(spent), money_read(held)
        limits = limit_read(limit), limit_read(stored)
        rows[pk] = BudgetRow(pk, tenant_id, *limits, spent, held, spent, held, alert_at(thresholds))
    return rows


def _refusal(row: BudgetRow, amount: Decimal) -> BudgetExhausted:
    label = Budget.objects.select_related("tenant").get(pk=row.pk).label
    remaining = ZERO if row.limit is None else max(row.limit - row.spent - row.held, ZERO)
    return BudgetExhausted(label, remaining, amount, settings.FAIRGATE_CURRENCY)


def _attempt(rid: str, done: Done, holds: Holds) -> str | BillingError:
    """The key this hold books under: the first attempt of the id not yet held, or one held and
    still open (a retried admission); refused once an attempt was charged."""
    for n in range(1, MAX_ATTEMPTS + 1):
        key = attempt_key(rid, n)
        if (key, Kind.CHARGE) in done:
            return RequestIdUsed(f"request id {rid!r} was used by a request that was served")
        if key not in holds or (key, Kind.RELEASE) not in done:
            return key
    return RequestIdUsed(f"request id {rid!r} was sent {MAX_ATTEMPTS} times without being served; use a new one")


def _open_hold(ask: HoldAsk, key: str, holds: Holds) -> HeldEntry | BillingError:
    """An open hold under ``key``: the same process asking again (its billing worker was
    replaced mid-batch) gets the hold it has; another process's request is live."""
    held = holds[key] or held_get(key)
    if held is None or held.owner != ask.owner:
        return RequestIdInUse(f"request id {ask.request_id!r} is in use by a live request")
    return held


def decide_hold(plan: BookingPlan, ask: HoldAsk, rows: dict[int, BudgetRow], holds: Holds, done: Done) -> None:
    key = _attempt(ask.request_id, done, holds)
    if isinstance(key, BillingError):
        plan.result = key
        return
    if key in holds:
        plan.result = _open_hold(ask, key, holds)
        return
    assert plan.priced is not None  # every hold's plan is priced (`_prepare`)
    candidates = [plan.priced]
    refused = None
    while candidates:
        priced = candidates.pop(0)
        held = priced.held if key == priced.held.request_id else priced.held.booked_as(key)
        moved = [rows[pk] for pk in held.budget_ids]
        blocking = next((row for row in moved if not row.fits(held.amount)), None)
        if blocking is None:
            for row in moved:
                row.held += held.amount
            room = _room(moved)
            plan.result = holds[key] = held.booked_as(key, UNLIMITED if room is None else room)
            plan.entries.append(
                _booked(
                    held,
                    Kind.HOLD,
                    held.amount,
                    ask.at,
                    prompt_tokens=ask.prompt_tokens,
                    completion_tokens=ask.max_output_tokens,
                    base_cost=money(priced.base),
                )
            )
            return
        if refused is None:
            refused = _refusal(blocking, held.amount)
            candidates = fallbacks_priced(ask) if ask.fallback else []
    plan.result = refused


def _room(rows: list[BudgetRow]) -> Decimal | None:
    """What the budget rows still have (the least of them); None if none has a limit."""
    rooms = [max(row.limit - row.spent - row.held, ZERO) for row in rows if row.limit is not None]
    return min(rooms) if rooms else None


def decide_end(plan: BookingPlan, ask: SettleAsk | ReleaseAsk, rows: dict[int, BudgetRow], done: Done) -> None:
    """A settlement or a release of a hold. A charge never exceeds its hold (nor, for a late
    settlement after the hold went back to the budget, what the budget still has): what the
    backend's usage priced beyond that is recorded as unbilled, so no budget is ever overspent."""
    held = plan.held
    assert held is not None  # `_prepare` lets no end without its hold into a batch
    rid = ask.request_id
    charged, released = done.get((rid, Kind.CHARGE)), done.get((rid, Kind.RELEASE))
    moved = [rows[pk] for pk in held.budget_ids]
    if isinstance(ask, ReleaseAsk):
        plan.result = charged is None and released is None
        if plan.result:
            plan.entries.append(_booked(held, Kind.RELEASE, held.amount, ask.at, reason=ask.reason))
            for row in moved:
                row.held -= held.amount
            done[rid, Kind.RELEASE] = (held.amount, ask.reason)
        return
    if charged is not None:  # a retried settlement charges once
        plan.result = Charged(charged[0])
        return
    if released is not None and released[1] not in LATE_SETTLEMENT_REASONS:
        log.warning("settlement of %s ignored: released (%s) before", rid, released[1])
        plan.result = Charged(ZERO)
        return
    if released is None:
        plan.entries.append(_booked(held, Kind.RELEASE, held.amount, ask.at, reason="settled"))
        for row in moved:
            row.held -= held.amount
        done[rid, Kind.RELEASE] = (held.amount, "settled")
        ceiling: Decimal | None = held.amount
    else:  # late: the hold went back to the budget when its process was taken for dead
        ceiling = _room(moved)
    charge, unbilled = capped(plan.charge, ceiling)
    plan.entries.append(
        _booked(
            held,
            Kind.CHARGE,
            charge,
            ask.at,
            backend_name=ask.backend_name,
            prompt_tokens=ask.prompt_tokens,
            completion_tokens=ask.completion_tokens,
            base_cost=money(plan.base),
            unbilled=unbilled,
        )
    )
    for row in moved:
        row.spent += charge
    done[rid, Kind.CHARGE] = (charge, "")
    plan.result = Charged(charge, unbilled)
    if unbilled:
        log.warning(
            "request %s: the backend's usage priced %s beyond what could be charged (%s); recorded as unbilled",
            rid,
            plan.charge,
            charge,
        )
