"""The ledger is append-only (model, queryset and database refuse), and `ledger verify` finds tampering."""

from __future__ import annotations

import io
from decimal import Decimal as D

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from billing.models import AppendOnlyError, LedgerEntry, TenantBilling
from billing.services import ledger_adjust
from tests.integration.billing.helpers import hold, settle, year_budget

pytestmark = pytest.mark.django_db


@pytest.fixture
def entry(world) -> LedgerEntry:
    hold("r1")
    settle("r1")
    return LedgerEntry.objects.get(request_id="r1", kind="charge")


def test_orm_cannot_change_or_delete_entries(entry):
    entry.amount = D("0")
    with pytest.raises(AppendOnlyError):
        entry.save()
    with pytest.raises(AppendOnlyError):
        entry.delete()
    with pytest.raises(AppendOnlyError):
        LedgerEntry.objects.filter(pk=entry.pk).update(amount=D("0"))
    with pytest.raises(AppendOnlyError):
        LedgerEntry.objects.filter(pk=entry.pk).delete()
    assert LedgerEntry.objects.get(pk=entry.pk).amount == D("1.12")


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE billing_ledgerentry SET amount = 0 WHERE id = %s",
        "DELETE FROM billing_ledgerentry WHERE id = %s",
    ],
)
def test_raw_sql_cannot_change_or_delete_entries(entry, sql):
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [entry.pk])
    assert LedgerEntry.objects.get(pk=entry.pk).amount == D("1.12")


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("column", "table"),
    [
        ("budget_id", "billing_budget"),
        ("month_budget_id", "billing_budget"),
        ("tenant_id", "gateway_tenant"),
        ("price_version_id", "scheduling_priceversion"),
    ],
)
def test_an_entry_naming_a_missing_row_is_refused(entry, column, table):
    """PostgreSQL checks the ledger's references with a trigger per statement (migration 0011;
    SQLite keeps its deferred foreign keys): one bad row among good ones refuses the statement."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) + 1000 FROM {table}")
        (missing,) = cursor.fetchone()
    columns = ("budget_id", "month_budget_id", "price_version_id", "tenant_id")
    named = ", ".join("%s" if c == column else c for c in columns)
    copied = (
        "SELECT 'adjustment', at, '', '', '', '', 0, 0, 0, 1, 1, 0, 'x', 'x', {}, '', 0, '', '', '' "
        "FROM billing_ledgerentry WHERE id = %s"
    )
    before = LedgerEntry.objects.count()
    with pytest.raises(DatabaseError):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO billing_ledgerentry (kind, at, request_id, class_name, model, backend_name, "
                "prompt_tokens, completion_tokens, base_cost, factor, amount, overrun, reason, author, "
                f"{', '.join(columns)}, owner, unbilled, job_id, key_creator, key_prefix) "
                f"{copied.format(', '.join(columns))} UNION ALL {copied.format(named)}",
                [entry.pk, missing, entry.pk],
            )
    assert LedgerEntry.objects.count() == before


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("table", "column"),
    [("billing_budget", "budget_id"), ("gateway_tenant", "tenant_id"), ("scheduling_priceversion", "price_version_id")],
)
def test_a_row_the_ledger_names_cannot_be_deleted(entry, table, column):
    named = getattr(entry, column)
    with pytest.raises(DatabaseError):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE id = %s", [named])
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE id = %s", [named])
        assert cursor.fetchone() == (1,)


def verify() -> str:
    out = io.StringIO()
    call_command("ledger", "verify", stdout=out, stderr=out)
    return out.getvalue()


def test_verify_passes_on_an_honest_ledger(entry, world):
    TenantBilling.objects.create(tenant=world["beta"], monthly_cap=D("100"))
    hold("b1", tenant="beta")
    hold("b2", tenant="beta")
    settle("b2")
    ledger_adjust(tenant_slug="beta", amount=D("-0.5"), reason="goodwill", author="fay")
    assert verify().startswith("ok: 3 budgets")


@pytest.mark.parametrize("column", ["spent", "held"])
def test_verify_finds_a_tampered_balance(entry, column):
    budget = year_budget("alpha")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE billing_budget SET {column} = {column} + 0.01 WHERE id = %s", [budget.pk])
    out = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command("ledger", "verify", stdout=out, stderr=out)
    assert info.value.returncode == 1
    assert f"alpha FY{budget.fiscal_year}" in out.getvalue() and column in out.getvalue()


def test_ledger_command_adjust_and_sweep(world):
    out = io.StringIO()
    call_command("ledger", "adjust", "alpha", "2.5", "--reason", "manual", "--author", "fay", stdout=out)
    assert year_budget("alpha").spent == D("2.5")
    with pytest.raises(CommandError) as info:
        call_command("ledger", "adjust", "alpha", "lots", "--reason", "x", "--author", "fay")
    assert info.value.returncode == 2
    call_command("ledger", "sweep", "--older-than-s", "0", stdout=out)
    assert "released 0 holds of dead processes and 0 stale holds with no owner" in out.getvalue()
