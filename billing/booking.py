"""Every budget move of the request path goes through `book`: a batch of holds, settlements and
releases applied in ONE short transaction, with one append of all its ledger entries.

The gateway collects what its requests ask for while the previous batch is being written and
books it all at once (group commit, billing.client), so under load a transaction serves many
requests; an idle gateway books each ask on its own at once. `billing.services` books single
asks through the same code, so there is one set of rules.

Inside the transaction, in this order:

1. The budget rows of the batch are locked in primary-key order (``SELECT ... FOR UPDATE`` on
   PostgreSQL; SQLite's IMMEDIATE transaction locks the database) and read with the limit
   configured right now (the tenant's annual budget or monthly cap). Every writer of a request
   (hold, settlement, release, the stale-hold sweep, an adjustment) takes its rows' locks first,
   in that order, so writers never deadlock and step 2 cannot race.
2. The ledger's entries of the batch's requests are read: a retried hold, a second settlement or
   a release after a settlement is decided from what is already booked (applied once). An id
   whose request ended unserved may be sent again: each attempt books under its own key
   (``id``, ``id#2``, ...), and an id that was served is refused.
3. The price versions of the batch's classes are re-read: a hold priced from the in-process cache
   is re-priced if another process made a newer version take effect before its admission (before
   its ``priced_at``: a batch line is priced at its batch's creation, batches.prices).
4. The asks are decided in order against the locked balances: a hold fits only if every row it
   moves keeps ``spent + held <= limit``, so concurrent holds at a budget's edge never overspend,
   and a charge never exceeds its hold (the rest of what usage priced is recorded as unbilled),
   so settling keeps ``spent + held <= limit`` too.
5. One append writes the entries (COPY on PostgreSQL); one UPDATE writes the moved rows' balances; alert-threshold
   crossings are recorded as alerts.

Each charge is published once the booking commits (events.publish_on_commit, billing.news). The
memo of holds in flight (billing.inflight) is not kept here but by the processes that book for a
gateway: the gateway's billing worker remembers the holds it booked (billing.worker_loop), so the
gateway's settlements and releases need not carry their hold; an end whose hold is in no memo
(replayed from a journal, asked by another process, a worker replaced since) reads it from the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from operator import attrgetter

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from billing import news, statements
from billing.alerts import alerts_record
from billing.budgets import ALERT_THRESHOLDS_PCT, BudgetScope, alert_at, budget_scope, thresholds_crossed
from billing.errors import BillingError, BudgetExhausted, HoldNotFound, RequestIdInUse, RequestIdUsed
from billing.inflight import UNLIMITED, HeldEntry, held_get
from billing.models import Budget, LedgerEntry
from billing.money import ZERO, money
from billing.pricing import (
    PriceInForce,
    backend_prices,
    capped,
    charge_of,
    price_version_at,
    upper_bound_base_cost,
)
from billing.selectors import fallback_classes
from events import publish_on_commit

log = logging.getLogger("fairgate.billing")
Kind = LedgerEntry.Kind
STALE_REASON = "stale"  # no owner to ask, released by age: a late settlement still charges what was consumed
OWNER_GONE_REASON = "owner_gone"  # released because its gateway process died (billing.heartbeats)
FORCED_REASON = "forced"  # released by an operator (`manage.py ledger release-forced`)
LATE_SETTLEMENT_REASONS = frozenset({STALE_REASON, OWNER_GONE_REASON, FORCED_REASON})
MAX_ATTEMPTS = 64  # requests one id may name: an id whose request ended unserved may be sent again
MAX_BATCH = 256  # asks per transaction (3 entries × 18 columns each stays far below bind limits)


@dataclass(frozen=True)
class HoldAsk:
    request_id: str
    tenant_slug: str
    class_name: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    at: datetime
    fallback: bool = False  # may fall back to a cheaper class if the tenant is configured to
    owner: str = ""  # the gateway process asking (billing.heartbeats); empty: not a gateway's request
    # The time whose price versions apply (a batch line: its batch's creation, batches.prices); None: ``at``.
    priced_at: datetime | None = None
    hold_cap: Decimal | None = None  # held at most this (a batch line: its part of its batch's cost bound)


@dataclass(frozen=True)
class SettleAsk:
    request_id: str
    backend_name: str
    prompt_tokens: int
    completion_tokens: int
    at: datetime
    # The unrounded base cost, priced by the gateway that told its client the charge (X-Charge)
    # from the backend's prices it had; None: priced here, from the backend's prices now.
    base_cost: Decimal | None = None
    held: HeldEntry | None = None  # the hold it ends, as booked; None: from this process's memo, else the ledger


@dataclass(frozen=True)
class ReleaseAsk:
    request_id: str
    reason: str
    at: datetime
    held: HeldEntry | None = None  # as for SettleAsk


Ask = HoldAsk | SettleAsk | ReleaseAsk


@dataclass(frozen=True)
class Charged:
    """A settlement's result: what was charged, and what the usage priced beyond what could be."""

    amount: Decimal
    unbilled: Decimal = ZERO


@dataclass(frozen=True)
class Booked:
    """One ledger entry as appended (the columns of LedgerEntry but its id)."""

    kind: str
    at: datetime
    tenant_id: int
    budget_id: int
    month_budget_id: int | None
    request_id: str
    class_name: str
    price_version_id: int | None
    model: str
    amount: Decimal
    factor: Decimal
    backend_name: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    base_cost: Decimal = ZERO
    overrun: Decimal = ZERO
    unbilled: Decimal = ZERO
    owner: str = ""
    reason: str = ""
    author: str = ""


COLUMNS = tuple(f.name for f in fields(Booked))
_columns_of = attrgetter(*COLUMNS)  # an entry's values in the order of COLUMNS
_AT = COLUMNS.index("at")
assert set(COLUMNS) == {f.attname for f in LedgerEntry._meta.concrete_fields if not f.primary_key}


def _booked(held: HeldEntry, *, kind: str, amount: Decimal, at: datetime, **extra) -> Booked:
    return Booked(
        kind=kind,
        at=at,
        tenant_id=held.tenant_id,
        budget_id=held.budget_id,
        month_budget_id=held.month_budget_id,
        request_id=held.request_id,
        class_name=held.class_name,
        price_version_id=held.price_version_id,
        model=held.model,
        amount=amount,
        factor=held.factor,
        owner=held.owner,
        **extra,
    )


# --- preparing: everything that needs no lock (cached prices, budget ids, the in-flight hold) ------


@dataclass
class _Priced:
    """A hold's ask priced for one class, with the price version it used."""

    ask: HoldAsk
    held: HeldEntry
    base: Decimal
    version: PriceInForce


@dataclass
class _Plan:
    ask: Ask
    priced: _Priced | None = None  # holds
    held: HeldEntry | None = None  # settlements and releases: the hold they end
    charge: Decimal = ZERO  # settlements
    base: Decimal = ZERO  # settlements
    result: object = None
    entries: list[Booked] = field(default_factory=list)

    @property
    def budget_ids(self) -> tuple[int, ...]:
        """The budget rows it moves: its hold's (as priced), or those of the hold it ends."""
        held = self.priced.held if self.priced is not None else self.held
        assert held is not None  # `_prepare` lets no end without its hold into a batch
        return held.budget_ids


def _check_tokens(*counts: int) -> None:
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts):
        raise BillingError(f"token counts are non-negative integers, not {counts}")


def _price(ask: HoldAsk, class_name: str, scope: BudgetScope, *, refresh: bool = False) -> _Priced:
    version = price_version_at(class_name=class_name, at=ask.priced_at or ask.at, refresh=refresh)
    base = upper_bound_base_cost(
        model=ask.model, prompt_tokens=ask.prompt_tokens, completion_tokens=ask.max_output_tokens, refresh=refresh
    )
    amount = charge_of(base_cost=base, factor=version.price_factor)
    held = HeldEntry(
        request_id=ask.request_id,
        tenant_id=scope.tenant_id,
        budget_id=scope.year_id,
        month_budget_id=scope.month_id,
        class_name=class_name,
        price_version_id=version.pk,
        model=ask.model,
        factor=version.price_factor,
        amount=amount if ask.hold_cap is None else min(amount, ask.hold_cap),
        owner=ask.owner,
    )
    return _Priced(ask, held, base, version)


def _prepare(ask: Ask) -> _Plan:
    plan = _Plan(ask)
    if not ask.request_id:
        raise BillingError("a billing ask needs a request id")
    if isinstance(ask, HoldAsk):
        _check_tokens(ask.prompt_tokens, ask.max_output_tokens)
        scope = budget_scope(tenant_slug=ask.tenant_slug, at=ask.at)
        plan.priced = _price(ask, ask.class_name, scope)
        return plan
    if isinstance(ask, ReleaseAsk) and not ask.reason:
        raise BillingError("a release needs a reason")
    plan.held = ask.held or held_get(ask.request_id)
    if isinstance(ask, ReleaseAsk) and plan.held is None:
        plan.result = False  # refused before anything was held
    if isinstance(ask, SettleAsk):
        _check_tokens(ask.prompt_tokens, ask.completion_tokens)
        if plan.held is None:
            raise HoldNotFound(f"request {ask.request_id!r} has no hold")
        base = ask.base_cost
        if base is not None and not base >= 0:
            raise BillingError(f"a base cost is not negative, not {base}")
        if base is None:
            base = backend_prices(backend_name=ask.backend_name).base_cost(
                prompt_tokens=ask.prompt_tokens, completion_tokens=ask.completion_tokens
            )
        plan.base = base
        plan.charge = charge_of(base_cost=base, factor=plan.held.factor)
    return plan


# --- inside the transaction ------------------------------------------------------------------------


@dataclass
class _Row:
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


class _ScopeStale(Exception):
    """A cached budget id no longer names the tenant's row (a flushed test database): re-read."""


def _money(value: Decimal | int | float) -> Decimal:
    """A money column as the driver returns it: PostgreSQL a Decimal, SQLite an int or the
    nearest float (exact to 6 places below 10^9)."""
    return money(Decimal(repr(value)) if isinstance(value, float) else Decimal(value))


def _limit(value: Decimal | int | float | None) -> Decimal | None:
    """A limit column (None: no limit) as `_money` reads it."""
    return None if value is None else _money(value)


def _rows(locked: Sequence[statements.Row]) -> dict[int, _Row]:
    """The locked budget rows by primary key, as `statements.booking_reads` returns them."""
    rows = {}
    for pk, tenant_id, limit, stored, spent, held, thresholds in locked:
        spent, held = _money(spent), _money(held)
        rows[pk] = _Row(pk, tenant_id, _limit(limit), _limit(stored), spent, held, spent, held, alert_at(thresholds))
    return rows


def attempt_key(request_id: str, attempt: int) -> str:
    """The ledger's key of the ``attempt``-th request sent with one id: the id itself, then ``id#2``..."""
    return request_id if attempt == 1 else f"{request_id}#{attempt}"


def attempt_of(key: str) -> str:
    """The request id an attempt's key was made from (ids never contain ``#``)."""
    return key.split("#", 1)[0]


Done = dict[tuple[str, str], tuple[Decimal, str]]
Holds = dict[str, HeldEntry | None]  # None: in the ledger, not read yet


def _note_entries(found: Sequence[statements.Row], done: Done, holds: Holds) -> None:
    """Adds ledger entries (request id, kind, amount, reason) to ``done`` ((request, kind) ->
    (amount, reason)), and to ``holds`` the keys that have a hold."""
    for request_id, kind, amount, reason in found:
        if kind == Kind.HOLD:
            holds[request_id] = None
        else:
            done[request_id, kind] = (_money(amount), reason)


def _lock_and_read(plans: list[_Plan], ids: set[int]) -> tuple[dict[int, _Row], Done, Holds, set[int]]:
    """Steps 1 to 3: the locked rows; what the ledger already has of the batch's requests (their
    charges and releases, and which of the requests asking for a hold have one: a retried
    admission); and the classes of the holds whose price was superseded. Holds of requests ending
    now are not read: the common case reads no row. An id whose request ended unserved (released,
    never charged) is asked again: its further attempts are read too."""
    priced = [p.priced for p in plans if p.priced is not None]
    holding = list({q.ask.request_id for q in priced})
    versions = sorted({(q.version.class_id, q.version.effective_at, q.version.pk) for q in priced})
    locked, found, superseded = statements.booking_reads(
        sorted(ids),
        list({p.ask.request_id for p in plans}),
        holding,
        at=max((q.ask.priced_at or q.ask.at for q in priced), default=None),
        versions=versions,
    )
    done: Done = {}
    holds: Holds = {}
    _note_entries(found, done, holds)
    again = [rid for rid in holding if (rid, Kind.RELEASE) in done and (rid, Kind.CHARGE) not in done]
    if again:
        attempts = [attempt_key(rid, n) for rid in again for n in range(2, MAX_ATTEMPTS + 1)]
        _note_entries(statements.entries_read(attempts, attempts), done, holds)
    return _rows(locked), done, holds, superseded


def _reprice_superseded(plans: list[_Plan], superseded: set[int]) -> None:
    """A hold priced from the cache is re-priced if a newer version of its class took effect
    before its admission (a change made in another process)."""
    for plan in plans:
        priced = plan.priced
        if priced is not None and priced.version.class_id in superseded:
            scope = budget_scope(tenant_slug=priced.ask.tenant_slug, at=priced.ask.at)
            plan.priced = _price(priced.ask, priced.held.class_name, scope, refresh=True)


def _refusal(row: _Row, amount: Decimal) -> BudgetExhausted:
    label = Budget.objects.select_related("tenant").get(pk=row.pk).label
    remaining = ZERO if row.limit is None else max(row.limit - row.spent - row.held, ZERO)
    return BudgetExhausted(label, remaining, amount, settings.FAIRGATE_CURRENCY)


def _fallbacks(ask: HoldAsk) -> list[_Priced]:
    names = fallback_classes(tenant_slug=ask.tenant_slug, class_name=ask.class_name, at=ask.at)
    scope = budget_scope(tenant_slug=ask.tenant_slug, at=ask.at)
    return [_price(ask, name, scope) for name in names]


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


def _decide_hold(plan: _Plan, ask: HoldAsk, rows: dict[int, _Row], holds: Holds, done: Done) -> None:
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
        held = priced.held.booked_as(key)
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
                    kind=Kind.HOLD,
                    amount=held.amount,
                    at=ask.at,
                    prompt_tokens=ask.prompt_tokens,
                    completion_tokens=ask.max_output_tokens,
                    base_cost=money(priced.base),
                )
            )
            return
        if refused is None:
            refused = _refusal(blocking, held.amount)
            candidates = _fallbacks(ask) if ask.fallback else []
    plan.result = refused


def _room(rows: list[_Row]) -> Decimal | None:
    """What the budget rows still have (the least of them); None if none has a limit."""
    rooms = [max(row.limit - row.spent - row.held, ZERO) for row in rows if row.limit is not None]
    return min(rooms) if rooms else None


def _decide_end(plan: _Plan, ask: SettleAsk | ReleaseAsk, rows: dict[int, _Row], done: Done) -> None:
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
            plan.entries.append(_booked(held, kind=Kind.RELEASE, amount=held.amount, at=ask.at, reason=ask.reason))
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
        plan.entries.append(_booked(held, kind=Kind.RELEASE, amount=held.amount, at=ask.at, reason="settled"))
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
            kind=Kind.CHARGE,
            amount=charge,
            at=ask.at,
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


def _write(entries: list[Booked], rows: list[_Row]) -> None:
    """Step 5: the append of the entries, the UPDATE of the moved rows."""
    adapt_at = connection.ops.adapt_datetimefield_value
    values = [list(_columns_of(entry)) for entry in entries]
    for row in values:
        row[_AT] = adapt_at(row[_AT])
    statements.booking_writes(
        COLUMNS,
        values,
        [(r.pk, money(r.spent), money(r.held), r.limit) for r in rows],
    )


def _alert(rows: list[_Row]) -> None:
    for row in rows:
        crossed = [
            p
            for p in thresholds_crossed(limit=row.limit, old_spent=row.old_spent, new_spent=row.spent)
            if p in row.alert_at
        ]
        if crossed:
            alerts_record(budget=Budget.objects.select_related("tenant").get(pk=row.pk), thresholds_pct=crossed)


def _apply(plans: list[_Plan]) -> None:
    ids = {pk for p in plans for pk in p.budget_ids}
    with transaction.atomic():
        rows, done, holds, superseded = _lock_and_read(plans, ids)
        if any(
            rows.get(pk) is None or rows[pk].tenant_id != p.priced.held.tenant_id
            for p in plans
            if p.priced
            for pk in p.priced.held.budget_ids
        ):
            raise _ScopeStale
        _reprice_superseded(plans, superseded)
        for plan in plans:
            ask = plan.ask
            if isinstance(ask, HoldAsk):
                _decide_hold(plan, ask, rows, holds, done)
            else:
                _decide_end(plan, ask, rows, done)
        entries = [e for p in plans for e in p.entries]
        moved = [r for r in rows.values() if r.dirty]
        _write(entries, moved)
        _alert(moved)
        for entry in entries:
            if entry.kind == Kind.CHARGE:
                publish_on_commit(news.CHARGE, entry.tenant_id, news.charge_news(entry))


def _book_prepared(plans: list[_Plan]) -> None:
    try:
        _apply(plans)
    except _ScopeStale:
        for plan in plans:
            if plan.priced is not None:
                ask = plan.priced.ask
                plan.priced = _price(
                    ask, ask.class_name, budget_scope(tenant_slug=ask.tenant_slug, at=ask.at, refresh=True)
                )
        _apply(plans)  # raised before deciding anything


def book(asks: list[Ask]) -> list[object]:
    """Apply the asks in one transaction; one result per ask, in order: for a hold its HeldEntry
    (its class may be a cheaper fallback) or the BudgetExhausted/BillingError refusing it; for a
    settlement the charge; for a release whether it released anything. A refused ask never
    fails the others; a batch the database refuses is booked again ask by ask."""
    results: list[object] = [None] * len(asks)
    plans, where = [], []
    for index, ask in enumerate(asks):
        try:
            plan = _prepare(ask)
        except BillingError as refused:
            results[index] = refused
            continue
        if plan.result is None:
            plans.append(plan)
            where.append(index)
        else:
            results[index] = plan.result
    for start in range(0, len(plans), MAX_BATCH):
        chunk = plans[start : start + MAX_BATCH]
        try:
            _book_prepared(chunk)
        except (OperationalError, InterfaceError):  # the database is out of reach: asking again one by one won't help
            raise
        except DatabaseError:
            if len(chunk) == 1:
                raise
            log.exception("a billing batch of %s failed; booking its asks one by one", len(chunk))
            for plan in chunk:
                plan.entries, plan.result = [], None
                try:
                    _book_prepared([plan])
                except (DatabaseError, BillingError) as failed:
                    plan.result = failed
    for index, plan in zip(where, plans):
        results[index] = plan.result
    return results


def book_one(ask: Ask) -> object:
    """`book` for a single ask: returns its result, raises its refusal."""
    result = book([ask])[0]
    if isinstance(result, BaseException):
        raise result
    return result
