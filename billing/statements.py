"""The statements of a booking (billing.booking), in the form each database books fastest.

On PostgreSQL each statement has one fixed text whatever the batch's size (arrays, or JSON rows
with ``json_to_recordset``), bound and prepared on the server; ledger entries go in by COPY, and
the reads of a step go in one round trip (pipeline mode). On SQLite and others, plain statements.
Each function is one step inside the caller's transaction; the caller holds the locks. Why:
docs/billing-and-console.md, "How bookings are written".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from billing.models import Budget, LedgerEntry, PriceVersion, TenantBilling
from tenants.models import Tenant

BUDGET = Budget._meta.db_table
LEDGER = LedgerEntry._meta.db_table
TENANT = Tenant._meta.db_table
TENANT_BILLING = TenantBilling._meta.db_table
PRICE_VERSION = PriceVersion._meta.db_table
# The booking's prepared statements are planned for the tables as they are at each run, not once:
# a plan cached on a new, empty ledger (a sequential scan) would be kept while it grows, until
# something (autovacuum's ANALYZE) invalidates it.
CUSTOM_PLANS_SQL = "SET LOCAL plan_cache_mode = force_custom_plan"
INSERT_ROWS = 32  # SQLite: rows per INSERT statement (a handful of texts, each parsed once and cached)
Row = Sequence[Any]


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def _psycopg_cursors(count: int) -> list[Any]:
    """``count`` psycopg cursors of the current connection (this thread's), made once per connection:
    ones that bind on the server and prepare what they run again (the connection's threshold, else
    this setting)."""
    connection.ensure_connection()
    raw = connection.connection
    made: tuple[Any, list[Any]] | None = getattr(connection, "_billing_cursors", None)
    if made is None or made[0] is not raw:
        raw.prepare_threshold = settings.FAIRGATE_BILLING_PREPARE_THRESHOLD or None  # None: never prepare
        made = (raw, [])
        setattr(connection, "_billing_cursors", made)  # noqa: B010 (ours, on Django's connection: not a typed attribute)
    cursors = made[1]
    while len(cursors) < count:
        cursors.append(psycopg.Cursor(raw))
    return cursors[:count]


def _wrapped(count: int) -> list[Any]:
    """``count`` of the connection's psycopg cursors in Django's wrapper (errors mapped, queries
    counted in tests), not closed after use."""
    return [
        connection._prepare_cursor(cursor)  # type: ignore[attr-defined]  # Django's private method: not in django-stubs
        for cursor in _psycopg_cursors(count)
    ]


@contextmanager
def _cursor() -> Iterator[Any]:
    """Django's cursor; on PostgreSQL one of `_wrapped` (made once per connection)."""
    if not _postgres():
        with connection.cursor() as cursor:
            yield cursor
        return
    yield _wrapped(1)[0]


def _together(batch: Sequence[tuple[str, Sequence[Any]]], *, rows: bool) -> list[list[Row]]:
    """Run the statements in order; with ``rows``, the rows of each. On PostgreSQL they go to the
    server in one round trip (pipeline mode, after BEGIN if a transaction is starting); an error of
    any of them is raised, mapped as Django maps it, once all are answered."""
    if not _postgres() or len(batch) == 1:
        answers = []
        for sql, params in batch:
            with _cursor() as cursor:
                cursor.execute(sql, params)
                answers.append(cursor.fetchall() if rows else [])
        return answers
    cursors = _wrapped(len(batch))
    with connection.wrap_database_errors, connection.connection.pipeline():
        for cursor, (sql, params) in zip(cursors, batch):
            cursor.execute(sql, params)
    return [cursor.fetchall() if rows and cursor.description is not None else [] for cursor in cursors]


def _json(rows: list[dict[str, Any]]) -> str:
    """Rows as one JSON parameter; a Decimal or a datetime as its text (exact: PostgreSQL parses it)."""
    return json.dumps(rows, default=str)


def _in(values: Sequence[object]) -> str:
    return ", ".join(["%s"] * len(values))


def _lock_sql(ids: Sequence[int]) -> tuple[str, list[object]]:
    head = (
        f"SELECT b.id, b.tenant_id, CASE WHEN b.kind = %s THEN t.annual_budget ELSE tb.monthly_cap END, "
        f'b."limit", b.spent, b.held, tb.alert_thresholds_pct FROM {BUDGET} b JOIN {TENANT} t ON t.id = b.tenant_id '
        f"LEFT JOIN {TENANT_BILLING} tb ON tb.tenant_id = b.tenant_id "
    )
    params: Sequence[object]
    if _postgres():
        sql, params = head + "WHERE b.id = ANY(%s::bigint[]) ORDER BY b.id FOR UPDATE OF b", [list(sorted(ids))]
    else:
        for_update = " FOR UPDATE OF b" if connection.features.has_select_for_update_of else ""
        sql, params = head + f"WHERE b.id IN ({_in(ids)}) ORDER BY b.id{for_update}", sorted(ids)
    return sql, [Budget.Kind.YEAR, *params]


def _entries_sql(ids: Sequence[str], holding: Sequence[str]) -> tuple[str, list[object]]:
    """The condition repeats the unique partial index's, so it is used."""
    if _postgres():
        sql = (
            f"SELECT request_id, kind, amount, reason FROM {LEDGER} WHERE request_id = ANY(%s::varchar[]) "
            f"AND NOT (kind = 'adjustment') AND (kind <> %s OR request_id = ANY(%s::varchar[]))"
        )
        return sql, [list(ids), LedgerEntry.Kind.HOLD, list(holding)]
    holds_too = f" OR request_id IN ({_in(holding)})" if holding else ""
    sql = (
        f"SELECT request_id, kind, amount, reason FROM {LEDGER} WHERE request_id IN ({_in(ids)}) "
        f"AND NOT (kind = 'adjustment') AND (kind <> %s{holds_too})"
    )
    return sql, [*ids, LedgerEntry.Kind.HOLD, *holding]


def _repriced_sql(at: datetime | None, versions: Sequence[tuple[int, datetime, int]]) -> tuple[str, list[object]]:
    """The classes of ``versions`` with a newer version in effect at ``at`` (None: a NULL, none is)."""
    adapt = connection.ops.adapt_datetimefield_value
    if _postgres():
        sql = (
            f"SELECT DISTINCT pv.priority_class_id FROM {PRICE_VERSION} pv "
            "JOIN json_to_recordset(%s::json) AS c(class_id bigint, since timestamptz, version_id bigint) "
            "ON pv.priority_class_id = c.class_id WHERE pv.effective_at <= %s "
            "AND (pv.effective_at > c.since OR (pv.effective_at = c.since AND pv.id > c.version_id))"
        )
        keys = ("class_id", "since", "version_id")
        return sql, [_json([dict(zip(keys, version)) for version in versions]), at]
    newer = " OR ".join(
        ["(priority_class_id = %s AND (effective_at > %s OR (effective_at = %s AND id > %s)))"] * len(versions)
    )
    sql = f"SELECT DISTINCT priority_class_id FROM {PRICE_VERSION} WHERE effective_at <= %s AND ({newer})"
    params: list[object] = [adapt(at)]
    for class_id, since, pk in versions:
        params += [class_id, adapt(since), adapt(since), pk]
    return sql, params


def booking_reads(
    lock_ids: Sequence[int],
    ids: Sequence[str],
    holding: Sequence[str],
    *,
    at: datetime | None,
    versions: Sequence[tuple[int, datetime, int]],
) -> tuple[list[Row], list[Row], set[int]]:
    """A booking's first step, in this order:

    0. on PostgreSQL, plan the transaction's prepared statements for each run (CUSTOM_PLANS_SQL);
    1. lock the budget rows ``lock_ids`` in primary-key order: (id, tenant id, limit configured
       now, stored limit, spent, held, the tenant's alert thresholds) each;
    2. `entries_read` of ``ids`` and ``holding``;
    3. of ``versions`` ((class id, effective at, version id) each), the classes whose newer version
       took effect at or before ``at`` (not read without ``versions``).

    The reads run after the lock is granted (one round trip on PostgreSQL, see `_together`)."""
    batch = [_lock_sql(lock_ids), _entries_sql(ids, holding)]
    if versions:
        batch.append(_repriced_sql(at, versions))
    planned: list[tuple[str, list[object]]] = [(CUSTOM_PLANS_SQL, [])] if _postgres() else []
    locked, entries, *repriced = _together(planned + batch, rows=True)[len(planned) :]
    return locked, entries, {class_id for (class_id,) in (repriced[0] if repriced else [])}


def entries_read(ids: Sequence[str], holding: Sequence[str]) -> list[Row]:
    """(request id, kind, amount, reason) of the charges and releases of ``ids``, and the holds
    of ``holding``."""
    return _together([_entries_sql(ids, holding)], rows=True)[0]


def _quoted(columns: tuple[str, ...]) -> str:
    return ", ".join(connection.ops.quote_name(c) for c in columns)


@functools.lru_cache(maxsize=8)
def _insert_sql(vendor: str, columns: tuple[str, ...], rows: int) -> str:
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    return f"INSERT INTO {LEDGER} ({_quoted(columns)}) VALUES " + ", ".join([row] * rows)


@functools.lru_cache(maxsize=2)
def _copy_sql(columns: tuple[str, ...]) -> str:
    return f"COPY {LEDGER} ({_quoted(columns)}) FROM STDIN"


def _insert_statements(columns: tuple[str, ...], rows: Sequence[Row]) -> list[tuple[str, list[object]]]:
    chunks = [rows[start : start + INSERT_ROWS] for start in range(0, len(rows), INSERT_ROWS)]
    return [
        (_insert_sql(connection.vendor, columns, len(chunk)), [v for row in chunk for v in row]) for chunk in chunks
    ]


def _copy_rows(columns: tuple[str, ...], rows: Sequence[Row]) -> None:
    """PostgreSQL: the ledger rows appended by COPY (text format; each value dumped by psycopg's
    own C dumpers and parsed by the server per column type, ``None`` as NULL). Measured against
    the INSERT from one JSON parameter it replaced, for 108 rows: client 5.7 against 9.1 µs a row,
    server 4.3 against 7.6, at the price of a round trip of its own (COPY cannot join a pipeline)."""
    (cursor,) = _psycopg_cursors(1)
    with connection.wrap_database_errors, cursor.copy(_copy_sql(columns)) as copy:
        for row in rows:
            copy.write_row(row)


def _write_sql() -> str:
    return (
        f'UPDATE {BUDGET} b SET spent = v.spent, held = v.held, "limit" = v.lim '
        "FROM json_to_recordset(%s::json) AS v(id bigint, spent numeric, held numeric, lim numeric) "
        "WHERE b.id = v.id"
    )


def booking_writes(
    columns: tuple[str, ...], entries: Sequence[Row], budget_rows: Sequence[tuple[int, object, object, object]]
) -> None:
    """A booking's last step: append the ledger ``entries`` (values in the order of ``columns``),
    then write (id, spent, held, limit) of each moved budget row."""
    if _postgres():
        if entries:
            _copy_rows(columns, entries)
        if budget_rows:
            keys = ("id", "spent", "held", "lim")
            _together([(_write_sql(), [_json([dict(zip(keys, row)) for row in budget_rows])])], rows=False)
        return
    if entries:
        _together(_insert_statements(columns, entries), rows=False)
    if budget_rows:
        with _cursor() as cursor:
            cursor.executemany(
                f'UPDATE {BUDGET} SET spent = %s, held = %s, "limit" = %s WHERE id = %s',
                [(spent, held, limit, pk) for pk, spent, held, limit in budget_rows],
            )
