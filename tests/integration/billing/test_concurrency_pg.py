"""Holds and settlements under real concurrency on PostgreSQL (skip without it; fail in CI).

Each thread uses its own database connection (Django's are per thread) and closes it at the end.
The server allows 100 connections and is shared, so at most MAX_CONNECTIONS threads are inside
the database at once; all 200 start together at a barrier.
"""

from __future__ import annotations

import threading
from decimal import Decimal as D

import pytest
from django.db import connection

from billing.errors import BudgetExhausted
from billing.models import Budget, LedgerEntry, TenantBilling
from billing.selectors import ledger_mismatches
from billing.services import hold_release
from tests.integration.billing.helpers import hold, settle, year_budget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
MAX_CONNECTIONS = 40


def run_concurrently(count: int, work) -> list:
    barrier = threading.Barrier(count)
    gate = threading.BoundedSemaphore(MAX_CONNECTIONS)
    results: list = [None] * count

    def run(index: int) -> None:
        barrier.wait()
        with gate:
            try:
                results[index] = work(index)
            except Exception as exc:  # the outcome under test, e.g. BudgetExhausted
                results[index] = exc
            finally:
                connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    return results


def test_on_postgresql():
    assert connection.vendor == "postgresql"


def test_200_concurrent_holds_never_overspend_and_exactly_the_admitted_ones_hold(world):
    world["alpha"].annual_budget = D("200")  # fits about 100 of these
    world["alpha"].save()
    big = {"prompt": 1000, "max_out": 500}  # 3.2
    small = {"prompt": 500, "max_out": 0}  # 0.8
    sizes = [big if i % 2 else small for i in range(200)]
    results = run_concurrently(200, lambda i: hold(f"c{i}", **sizes[i]))
    admitted = {f"c{i}": r.amount for i, r in enumerate(results) if not isinstance(r, Exception)}
    refused = [r for r in results if isinstance(r, Exception)]
    assert admitted and refused and all(isinstance(r, BudgetExhausted) for r in refused)
    budget = year_budget("alpha")
    holds = dict(LedgerEntry.objects.filter(kind="hold").values_list("request_id", "amount"))
    assert holds == admitted
    assert budget.held == sum(admitted.values()) <= D("200")
    assert budget.remaining >= 0
    assert all(budget.remaining < r.needed for r in refused)  # each refusal really did not fit
    assert ledger_mismatches() == []


def test_concurrent_holds_across_year_and_month_budgets_do_not_deadlock(world):
    TenantBilling.objects.create(tenant=world["alpha"], monthly_cap=D("50"))
    results = run_concurrently(120, lambda i: hold(f"m{i}", tenant="alpha" if i % 3 else "beta"))
    admitted_alpha = sum(1 for i, r in enumerate(results) if i % 3 and not isinstance(r, Exception))
    assert admitted_alpha == 15  # 15 × 3.2 = 48 <= 50 < 16 × 3.2
    month = Budget.objects.get(tenant__slug="alpha", kind="month")
    assert month.held == year_budget("alpha").held == D("48")
    assert ledger_mismatches() == []


def test_concurrent_retries_of_one_settlement_charge_once(world):
    hold("r1")
    results = run_concurrently(20, lambda i: settle("r1"))
    assert results == [D("1.12")] * 20
    assert LedgerEntry.objects.filter(request_id="r1", kind="charge").count() == 1
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.12"), D("0"))


def test_concurrent_retries_of_one_hold_hold_once(world):
    results = run_concurrently(20, lambda i: hold("same"))
    assert {r.amount for r in results} == {D("3.2")}
    assert year_budget("alpha").held == D("3.2")


@pytest.mark.parametrize("monthly_cap", [None, D("500")], ids=["one-statement", "year-and-month-rows"])
def test_release_racing_settlement_ends_in_exactly_one_outcome(world, monthly_cap):
    if monthly_cap is not None:  # two budget rows: the write runs as separate statements in a transaction
        TenantBilling.objects.create(tenant=world["alpha"], monthly_cap=monthly_cap)
    for n in range(20):
        hold(f"race{n}")
    results = run_concurrently(
        40, lambda i: settle(f"race{i // 2}") if i % 2 else hold_release(request_id=f"race{i // 2}", reason="cancelled")
    )
    assert not [r for r in results if isinstance(r, Exception)]
    charged = LedgerEntry.objects.filter(kind="charge").count()
    budget = year_budget("alpha")
    assert budget.held == 0 and budget.spent == D("1.12") * charged
    assert LedgerEntry.objects.filter(kind="release").count() == 20
    for row in Budget.objects.filter(tenant__slug="alpha"):
        assert (row.held, row.spent) == (0, budget.spent)
    assert ledger_mismatches() == []


def test_concurrent_retries_of_settlement_and_release_of_many_requests_charge_each_once(world):
    TenantBilling.objects.create(tenant=world["alpha"], monthly_cap=D("500"))
    for n in range(10):
        hold(f"s{n}")
    results = run_concurrently(
        60, lambda i: settle(f"s{i % 10}") if i % 3 else hold_release(request_id=f"s{i % 10}", reason="cancelled")
    )
    assert not [r for r in results if isinstance(r, Exception)]
    assert LedgerEntry.objects.filter(kind="charge").count() <= 10
    assert LedgerEntry.objects.filter(kind="release").count() == 10
    assert all(row.held == 0 for row in Budget.objects.filter(tenant__slug="alpha"))
    assert ledger_mismatches() == []
