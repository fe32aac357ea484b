"""The statements of a booking (billing.booking), in the form each database books fastest.

* **PostgreSQL**: every statement has one fixed text whatever the batch's size — a batch's values
  go in as arrays (``= ANY(%s)``, ``unnest(...)``) — and is bound and prepared on the server, so
  neither psycopg nor the server parses or plans it again per batch. (Measured: client-side
  binding of a 32-row, 640-parameter INSERT cost more than the server's work; with one text per
  statement, prepared, billing on reached 0.90x of billing off's throughput against 0.67x.)
  Prepared statements need a session, not a transaction-pooling proxy: set
  ``FAIRGATE_BILLING_PREPARE_THRESHOLD=0`` behind one that cannot keep them (PgBouncer < 1.21).
* **SQLite and others**: plain statements through Django's cursor, one ``%s`` per value.

Each function is one statement inside the caller's transaction; the caller holds the locks.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from billing.models import Budget, LedgerEntry, TenantBilling
from gateway.models import Tenant
from scheduling.models import PriceVersion

BUDGET = Budget._meta.db_table
LEDGER = LedgerEntry._meta.db_table
TENANT = Tenant._meta.db_table
TENANT_BILLING = TenantBilling._meta.db_table
PRICE_VERSION = PriceVersion._meta.db_table
INSERT_ROWS = 32  # SQLite: rows per INSERT statement (a handful of texts, each parsed once and cached)
Row = Sequence[Any]


def _postgres() -> bool:
    return connection.vendor == "postgresql"


@contextmanager
def _cursor() -> Iterator[Any]:
    """Django's cursor (errors mapped, queries counted in tests); on PostgreSQL one that binds on
    the server and prepares what it runs again (the connection's threshold, else this setting)."""
    if not _postgres():
        with connection.cursor() as cursor:
            yield cursor
        return
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    threshold = settings.FAIRGATE_BILLING_PREPARE_THRESHOLD
    raw.prepare_threshold = threshold or None  # None: never prepare
    with connection._prepare_cursor(psycopg.Cursor(raw)) as cursor:
        yield cursor


def _in(values: Sequence[object]) -> str:
    return ", ".join(["%s"] * len(values))


def budget_rows_lock(ids: Sequence[int]) -> list[Row]:
    """Lock the budget rows in primary-key order; (id, tenant id, limit configured now, stored
    limit, spent, held) each."""
    head = (f'SELECT b.id, b.tenant_id, CASE WHEN b.kind = %s THEN t.annual_budget ELSE tb.monthly_cap END, '
            f'b."limit", b.spent, b.held FROM {BUDGET} b JOIN {TENANT} t ON t.id = b.tenant_id '
            f"LEFT JOIN {TENANT_BILLING} tb ON tb.tenant_id = b.tenant_id ")
    if _postgres():
        sql, params = head + "WHERE b.id = ANY(%s::bigint[]) ORDER BY b.id FOR UPDATE OF b", [list(sorted(ids))]
    else:
        for_update = " FOR UPDATE OF b" if connection.features.has_select_for_update_of else ""
        sql, params = head + f"WHERE b.id IN ({_in(ids)}) ORDER BY b.id{for_update}", sorted(ids)
    with _cursor() as cursor:
        cursor.execute(sql, [Budget.Kind.YEAR, *params])
        return cursor.fetchall()


def entries_read(ids: Sequence[str], holding: Sequence[str]) -> list[Row]:
    """(request id, kind, amount, reason) of the charges and releases of ``ids``, and the holds
    of ``holding``. The condition repeats the unique partial index's, so it is used."""
    if _postgres():
        sql = (f"SELECT request_id, kind, amount, reason FROM {LEDGER} WHERE request_id = ANY(%s::varchar[]) "
               f"AND NOT (kind = 'adjustment') AND (kind <> %s OR request_id = ANY(%s::varchar[]))")
        params: list[object] = [list(ids), LedgerEntry.Kind.HOLD, list(holding)]
    else:
        holds_too = f" OR request_id IN ({_in(holding)})" if holding else ""
        sql = (f"SELECT request_id, kind, amount, reason FROM {LEDGER} WHERE request_id IN ({_in(ids)}) "
               f"AND NOT (kind = 'adjustment') AND (kind <> %s{holds_too})")
        params = [*ids, LedgerEntry.Kind.HOLD, *holding]
    with _cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def classes_repriced(*, at: datetime, versions: Sequence[tuple[int, datetime, int]]) -> set[int]:
    """Of ``versions`` ((class id, effective at, version id) each), the classes whose newer version
    took effect at or before ``at``."""
    adapt = connection.ops.adapt_datetimefield_value
    if _postgres():
        sql = (f"SELECT DISTINCT pv.priority_class_id FROM {PRICE_VERSION} pv "
               "JOIN unnest(%s::bigint[], %s::timestamptz[], %s::bigint[]) AS c(class_id, since, version_id) "
               "ON pv.priority_class_id = c.class_id WHERE pv.effective_at <= %s "
               "AND (pv.effective_at > c.since OR (pv.effective_at = c.since AND pv.id > c.version_id))")
        params: list[object] = [[v[0] for v in versions], [v[1] for v in versions], [v[2] for v in versions], at]
    else:
        newer = " OR ".join(["(priority_class_id = %s AND (effective_at > %s OR (effective_at = %s AND id > %s)))"]
                            * len(versions))
        sql = f"SELECT DISTINCT priority_class_id FROM {PRICE_VERSION} WHERE effective_at <= %s AND ({newer})"
        params = [adapt(at)]
        for class_id, since, pk in versions:
            params += [class_id, adapt(since), adapt(since), pk]
    with _cursor() as cursor:
        cursor.execute(sql, params)
        return {class_id for (class_id,) in cursor.fetchall()}


@functools.lru_cache(maxsize=8)
def _insert_sql(vendor: str, columns: tuple[str, ...], rows: int) -> str:
    quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
    if vendor == "postgresql":
        fields = {f.attname: f for f in LedgerEntry._meta.concrete_fields}
        arrays = ", ".join(f"%s::{fields[c].db_type(connection)}[]" for c in columns)
        return f"INSERT INTO {LEDGER} ({quoted}) SELECT * FROM unnest({arrays})"
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    return f"INSERT INTO {LEDGER} ({quoted}) VALUES " + ", ".join([row] * rows)


def entries_insert(columns: tuple[str, ...], rows: Sequence[Row]) -> None:
    """Append ledger entries: ``rows`` of values in the order of ``columns``."""
    with _cursor() as cursor:
        if _postgres():
            cursor.execute(_insert_sql("postgresql", columns, 0), [list(values) for values in zip(*rows)])
            return
        for start in range(0, len(rows), INSERT_ROWS):
            chunk = rows[start:start + INSERT_ROWS]
            cursor.execute(_insert_sql(connection.vendor, columns, len(chunk)), [v for row in chunk for v in row])


def budget_rows_write(rows: Sequence[tuple[int, object, object, object]]) -> None:
    """(id, spent, held, limit) of each moved budget row."""
    with _cursor() as cursor:
        if _postgres():
            cursor.execute(f'UPDATE {BUDGET} b SET spent = v.spent, held = v.held, "limit" = v.lim '
                           "FROM unnest(%s::bigint[], %s::numeric[], %s::numeric[], %s::numeric[]) "
                           "AS v(id, spent, held, lim) WHERE b.id = v.id", [list(column) for column in zip(*rows)])
            return
        cursor.executemany(f'UPDATE {BUDGET} SET spent = %s, held = %s, "limit" = %s WHERE id = %s',
                           [(spent, held, limit, pk) for pk, spent, held, limit in rows])
