"""On a new database the booking keeps using the ledger's index as the ledger grows: its prepared
statements are planned for the table as it is at each run, never from a plan cached while the
table was empty (a sequential scan kept until autovacuum's ANALYZE invalidates it)."""

from __future__ import annotations

import pytest
from django.db import connection

from billing.statements import LEDGER
from tests.integration.billing.helpers import hold

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]
GROWN_ROWS = 20_000


def ledger_scans() -> tuple[int, int]:
    """(sequential, index) scans of the ledger by this transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_xact_user_tables WHERE relname = %s", [LEDGER]
        )
        seq, idx = cursor.fetchone()
    return seq, idx


def grow_the_ledger(rows: int) -> None:
    """``rows`` more holds, copied from one booked here (no booking reads them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LEDGER} (kind, at, tenant_id, budget_id, month_budget_id, request_id, class_name, "
            "price_version_id, model, backend_name, prompt_tokens, completion_tokens, base_cost, factor, amount, "
            "overrun, unbilled, owner, reason, author) "
            "SELECT kind, at, tenant_id, budget_id, month_budget_id, 'filler-' || n, class_name, price_version_id, "
            "model, backend_name, prompt_tokens, completion_tokens, base_cost, factor, amount, overrun, unbilled, "
            f"owner, reason, author FROM {LEDGER} CROSS JOIN generate_series(1, %s) AS n WHERE request_id = 'warm-0'",
            [rows],
        )


def test_the_bookings_read_uses_the_index_once_a_new_ledger_has_grown(world):
    connection.ensure_connection()
    connection.connection.prepare_threshold = 2  # as FAIRGATE_BILLING_PREPARE_THRESHOLD's default
    for n in range(12):  # prepared, then run often enough for the server to cache a plan
        hold(f"warm-{n}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [f"%FROM {LEDGER}%"])
        assert cursor.fetchone()[0] >= 1  # the booking's reads are prepared statements
    grow_the_ledger(GROWN_ROWS)
    seq_before, idx_before = ledger_scans()
    hold("after-growth")
    seq_after, idx_after = ledger_scans()
    assert seq_after == seq_before, "the booking scanned the whole ledger"
    assert idx_after > idx_before
