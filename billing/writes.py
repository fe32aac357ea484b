"""Ledger entries and the budget moves they cause, written together in as few round trips as the
database allows. This is billing's only raw SQL on the hot path; it exists to save round trips.

Every writer moves the budget rows first, in primary-key order, and appends ledger entries after.
Writers of one request (a retried hold or settlement, a release racing a settlement) therefore
meet on the budget row lock before they meet on the ledger's unique (request_id, kind), and can
never deadlock; adjustments lock the rows first too.

* PostgreSQL with one budget row (a tenant without a monthly cap, the common case): ONE statement.
  The UPDATE runs in a data-modifying WITH and the INSERT takes its go-ahead from the UPDATE's
  output, so nothing is appended when the row did not move (a hold that does not fit), and a
  unique violation undoes the move with the rest of the statement. Outside a transaction it
  needs no BEGIN/COMMIT: one round trip.
* Otherwise (SQLite, or a year and a month row): one UPDATE ... RETURNING per row, then one
  INSERT, inside the caller's transaction.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from decimal import Decimal
from typing import ContextManager

from django.db import connection, transaction
from django.db.models.signals import post_save

from billing.models import Budget, LedgerEntry
from billing.money import money

BUDGET_TABLE = Budget._meta.db_table
LEDGER_TABLE = LedgerEntry._meta.db_table
_FIELDS = [f for f in LedgerEntry._meta.concrete_fields if not f.primary_key]


class RowNotMoved(Exception):
    """An UPDATE matched no row (a hold that does not fit): nothing was appended. Raised inside the
    caller's transaction, it rolls back any row moved before."""

    def __init__(self, index: int) -> None:
        super().__init__(f"budget move {index} matched no row")
        self.index = index


@dataclass(frozen=True)
class Move:
    """An UPDATE of one budget row that ends in `RETURNING spent, "limit"` (named %(…)s params)."""

    sql: str
    params: dict


@dataclass(frozen=True)
class Moved:
    spent: Decimal
    limit: Decimal | None


def move_by(budget_id: int, *, spent_delta: Decimal, held_delta: Decimal) -> Move:
    sql = (f"UPDATE {BUDGET_TABLE} SET spent = ROUND(spent + %(spent_delta)s, 6), "
           f"held = ROUND(held + %(held_delta)s, 6) WHERE id = %(budget_id)s")
    return Move(sql, {"spent_delta": spent_delta, "held_delta": held_delta, "budget_id": budget_id})


def one_statement(moves: list[Move]) -> bool:
    return connection.vendor == "postgresql" and len(moves) == 1


def atomic_for(moves: list[Move]) -> ContextManager:
    """A transaction, unless the write is one statement outside any transaction (atomic by itself)."""
    if one_statement(moves) and not connection.in_atomic_block:
        return contextlib.nullcontext()
    return transaction.atomic()


def _money_from_db(value) -> Decimal | None:
    """PostgreSQL returns NUMERIC as Decimal; SQLite the nearest float (exact to 6 places below 10^9)."""
    if value is None:
        return None
    return money(Decimal(repr(value)) if isinstance(value, float) else Decimal(value))


@functools.lru_cache(maxsize=8)
def _row_template(vendor: str, cast: bool) -> tuple[str, str]:
    """(the column list, one row of placeholders named `{i}_column`), per database vendor.
    Typed when `cast`: PostgreSQL infers nothing from a bare NULL in a multi-row VALUES."""
    columns = ", ".join(connection.ops.quote_name(f.column) for f in _FIELDS)
    cells = [f"%({{i}}_{f.column})s" for f in _FIELDS]
    if cast:
        cells = [f"CAST({cell} AS {f.cast_db_type(connection)})" for cell, f in zip(cells, _FIELDS)]
    return columns, "(" + ", ".join(cells) + ")"


def _values_sql(entries: list[LedgerEntry], *, cast: bool) -> tuple[str, str, dict]:
    """The column list, `(…), (…)` rows of named placeholders for `entries`, and their params."""
    columns, row = _row_template(connection.vendor, cast)
    rows, params = [], {}
    for index, entry in enumerate(entries):
        rows.append(row.replace("{i}", f"e{index}"))
        for field in _FIELDS:
            params[f"e{index}_{field.column}"] = field.get_db_prep_save(getattr(entry, field.attname), connection)
    return columns, ", ".join(rows), params


def write(moves: list[Move], entries: list[LedgerEntry]) -> list[Moved]:
    """Apply `moves` (primary-key order), then append `entries` (their pks are set, and post_save
    is sent for each as `create()` would). Returns each row after its move; raises RowNotMoved."""
    moved = _write_one_statement(moves[0], entries) if one_statement(moves) else _write_in_steps(moves, entries)
    for entry in entries:  # receivers (the console's live feed) listen for post_save
        entry._state.adding, entry._state.db = False, connection.alias
        post_save.send(sender=LedgerEntry, instance=entry, created=True, update_fields=None, raw=False,
                       using=connection.alias)
    return moved


def _write_one_statement(move: Move, entries: list[LedgerEntry]) -> list[Moved]:
    columns, values, params = _values_sql(entries, cast=True)
    sql = f"""
        WITH moved AS ({move.sql} RETURNING spent, "limit"),
             posted AS (
                 INSERT INTO {LEDGER_TABLE} ({columns})
                 SELECT * FROM (VALUES {values}) AS entry WHERE EXISTS (SELECT 1 FROM moved)
                 RETURNING id)
        SELECT posted.id, moved.spent, moved."limit" FROM posted CROSS JOIN moved ORDER BY posted.id"""
    with connection.cursor() as cursor:
        cursor.execute(sql, {**move.params, **params})
        rows = cursor.fetchall()
    if not rows:
        raise RowNotMoved(0)
    for entry, (pk, _, _) in zip(entries, rows):
        entry.pk = pk
    return [Moved(_money_from_db(rows[0][1]), _money_from_db(rows[0][2]))]


def _write_in_steps(moves: list[Move], entries: list[LedgerEntry]) -> list[Moved]:
    moved = []
    with connection.cursor() as cursor:
        for index, move in enumerate(moves):
            cursor.execute(f'{move.sql} RETURNING spent, "limit"', move.params)
            row = cursor.fetchone()
            if row is None:
                raise RowNotMoved(index)
            moved.append(Moved(_money_from_db(row[0]), _money_from_db(row[1])))
        columns, values, params = _values_sql(entries, cast=False)
        cursor.execute(f"INSERT INTO {LEDGER_TABLE} ({columns}) VALUES {values} RETURNING id", params)
        for entry, (pk,) in zip(entries, sorted(cursor.fetchall())):  # RETURNING order is SQLite's choice
            entry.pk = pk
    return moved
