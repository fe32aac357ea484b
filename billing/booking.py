"""Every budget move of the request path goes through `book`: a batch of holds, settlements and
releases applied in ONE short transaction, with one append of all its ledger entries.

The asks: billing.booking_asks. Each is prepared outside the transaction (billing.booking_plans);
inside it the budget rows are locked, the ledger's entries of the batch's requests read, the
superseded prices re-read, the asks decided in order (billing.booking_decisions) and written.
The rules and why they hold: docs/money.md ("How a batch is booked").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from billing import news, statements
from billing.alerts import alerts_record
from billing.booking_asks import COLUMNS, MAX_ATTEMPTS, Ask, Booked, HoldAsk, attempt_key
from billing.booking_decisions import BudgetRow, Done, Holds, budget_rows, decide_end, decide_hold, money_read
from billing.booking_plans import BookingPlan, prepare, price_hold
from billing.budgets import budget_scope, thresholds_crossed
from billing.errors import BillingError
from billing.models import Budget, LedgerEntry
from billing.money import money
from events import Event, publish_all_on_commit

log = logging.getLogger("fairgate.billing")
Kind = LedgerEntry.Kind
_AT = COLUMNS.index("at")
MAX_BATCH = 256  # asks per transaction (3 entries × 23 columns each stays far below bind limits)


class _ScopeStale(Exception):
    """A cached budget id no longer names the tenant's row (a flushed test database): re-read."""


def _note_entries(found: Sequence[statements.Row], done: Done, holds: Holds) -> None:
    """Adds ledger entries (request id, kind, amount, reason) to ``done`` ((request, kind) ->
    (amount, reason)), and to ``holds`` the keys that have a hold."""
    for request_id, kind, amount, reason in found:
        if kind == Kind.HOLD:
            holds[request_id] = None
        else:
            done[request_id, kind] = (money_read(amount), reason)


def _lock_and_read(plans: list[BookingPlan], ids: set[int]) -> tuple[dict[int, BudgetRow], Done, Holds, set[int]]:
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
    return budget_rows(locked), done, holds, superseded


def _reprice_superseded(plans: list[BookingPlan], superseded: set[int]) -> None:
    """A hold priced from the cache is re-priced if a newer version of its class took effect
    before its admission (a change made in another process)."""
    for plan in plans:
        priced = plan.priced
        if priced is not None and priced.version.class_id in superseded:
            scope = budget_scope(tenant_slug=priced.ask.tenant_slug, at=priced.ask.at)
            plan.priced = price_hold(priced.ask, priced.held.class_name, scope, refresh=True)


def _write(entries: list[Booked], rows: list[BudgetRow]) -> None:
    """Step 5: the append of the entries, the UPDATE of the moved rows."""
    values: Sequence[Sequence[object]] = entries  # a Booked is its row; PostgreSQL's driver takes its datetimes
    if connection.vendor != "postgresql":
        adapt_at = connection.ops.adapt_datetimefield_value
        values = [[*entry[:_AT], adapt_at(entry.at), *entry[_AT + 1 :]] for entry in entries]
    statements.booking_writes(
        COLUMNS,
        values,
        [(r.pk, money(r.spent), money(r.held), r.limit) for r in rows],
    )


def _alert(rows: list[BudgetRow]) -> None:
    for row in rows:
        percents = thresholds_crossed(limit=row.limit, old_spent=row.old_spent, new_spent=row.spent)
        crossed = [p for p in percents if p in row.alert_at]
        if crossed:
            alerts_record(budget=Budget.objects.select_related("tenant").get(pk=row.pk), thresholds_pct=crossed)


def _apply(plans: list[BookingPlan]) -> None:
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
                decide_hold(plan, ask, rows, holds, done)
            else:
                decide_end(plan, ask, rows, done)
        entries = [e for p in plans for e in p.entries]
        moved = [r for r in rows.values() if r.dirty]
        _write(entries, moved)
        _alert(moved)
        charge = Kind.CHARGE
        publish_all_on_commit(
            [Event(news.CHARGE, e.tenant_id, news.charge_news(e)) for e in entries if e.kind == charge]
        )


def _book_prepared(plans: list[BookingPlan]) -> None:
    try:
        _apply(plans)
    except _ScopeStale:
        for plan in plans:
            if plan.priced is not None:
                ask = plan.priced.ask
                plan.priced = price_hold(
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
            plan = prepare(ask)
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
