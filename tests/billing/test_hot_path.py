"""The hot path's cost and its caches: how many queries a hold and a settlement take, and that
what is cached never lets a stale price, limit or hold through.

Query counts are taken after a warm-up hold has filled the caches, with the on-commit callbacks
run (they remember the hold for its settlement). Inside the test's transaction each write is a
savepoint: SAVEPOINT, UPDATE, INSERT, RELEASE on SQLite; SAVEPOINT, one statement, RELEASE on
PostgreSQL. In autocommit, as in the gateway, PostgreSQL runs a hold or release as one statement
and a settlement as BEGIN, one statement, COMMIT (the alerts it may record share its transaction).
"""
from __future__ import annotations

import contextlib
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db import connection, transaction
from django.utils import timezone

from billing import cache
from billing.errors import BudgetExhausted, HoldNotFound
from billing.inflight import held_get
from billing.models import Budget, LedgerEntry, TenantBilling
from billing.selectors import ledger_mismatches
from billing.services import hold_release, holds_release_stale
from gateway.models import Tenant
from scheduling.models import Backend, PriceVersion
from tests.billing.helpers import hold, settle, year_budget

IN_A_TRANSACTION = {"sqlite": 4, "postgresql": 3}
AUTOCOMMIT_PG = {"hold": 1, "settle": 3, "release": 1}


def _run_pairs(assert_max, limits: dict[str, int], committed=None) -> None:
    committed = committed or (lambda: contextlib.nullcontext())
    hold("warm-up")
    with committed(), assert_max(limits["hold"]):
        hold("r1")
    with assert_max(limits["settle"]):
        assert settle("r1") == D("1.12")
    with committed(), assert_max(limits["hold"]):
        hold("r2")
    with assert_max(limits["release"]):
        hold_release(request_id="r2", reason="cancelled")
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.12"), D("3.2"))  # the warm-up is still held
    assert ledger_mismatches() == []


@pytest.mark.django_db
def test_hold_and_settle_take_one_short_transaction_each(world, django_assert_max_num_queries,
                                                         django_capture_on_commit_callbacks):
    limit = IN_A_TRANSACTION[connection.vendor]
    _run_pairs(django_assert_max_num_queries, {"hold": limit, "settle": limit, "release": limit},
               committed=lambda: django_capture_on_commit_callbacks(execute=True))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_in_autocommit_a_hold_is_one_statement(world, django_assert_max_num_queries):
    _run_pairs(django_assert_max_num_queries, AUTOCOMMIT_PG)


@pytest.mark.django_db
def test_a_monthly_cap_costs_one_more_update(world, django_assert_max_num_queries):
    TenantBilling.objects.create(tenant=world["alpha"], monthly_cap=D("100"))
    hold("warm-up")
    with django_assert_max_num_queries(5):  # SAVEPOINT, UPDATE year, UPDATE month, INSERT, RELEASE
        hold("r1")
    month = Budget.objects.get(tenant__slug="alpha", kind="month")
    assert month.held == year_budget("alpha").held == D("6.4")


@pytest.mark.django_db
def test_a_price_change_made_elsewhere_applies_to_the_next_admission(world):
    hold("before")  # caches INTERACTIVE's versions
    # Another process's change: no signal reaches this process's caches.
    PriceVersion.objects.bulk_create([PriceVersion(priority_class_id=PriceVersion.objects.first().priority_class_id,
                                                   price_factor=D("3"), effective_at=timezone.now(), created_by="x")])
    cls = PriceVersion.objects.order_by("-pk").first().priority_class.name
    result = hold("after", cls=cls)
    assert result.factor == D("3")
    assert LedgerEntry.objects.get(request_id="after").price_version_id == PriceVersion.objects.order_by("-pk")[0].pk


@pytest.mark.django_db
def test_a_budget_changed_elsewhere_applies_to_the_next_hold(world):
    hold("r1")  # caches alpha's budget row
    Tenant.objects.filter(slug="alpha").update(annual_budget=D("5"))  # no signal: as from another process
    with pytest.raises(BudgetExhausted) as info:
        hold("r2")
    assert info.value.remaining == D("1.8")
    assert year_budget("alpha").limit == D("5")  # the row's copy of the limit follows too
    Tenant.objects.filter(slug="alpha").update(annual_budget=D("7"))
    hold("r3")


@pytest.mark.django_db
def test_a_monthly_cap_set_elsewhere_applies_within_the_cache_lifetime(world, monkeypatch):
    hold("r1")
    TenantBilling.objects.bulk_create([TenantBilling(tenant=world["alpha"], monthly_cap=D("4"))])  # no signal
    clock = [cache.time.monotonic() + cache.CACHE_TTL_S + 0.01]
    monkeypatch.setattr(cache.time, "monotonic", lambda: clock[0])
    hold("r2")  # the month budget starts at this hold: 3.2 of 4
    with pytest.raises(BudgetExhausted) as info:
        hold("r3")
    assert "month" in info.value.budget_label


@pytest.mark.django_db
def test_backend_prices_are_reread_after_the_cache_lifetime(world, monkeypatch):
    hold("r1")
    assert settle("r1") == D("1.12")
    Backend.objects.filter(name="gpu-b").update(input_price_per_1k=D("1"))  # no signal
    clock = [cache.time.monotonic() + cache.CACHE_TTL_S + 0.01]
    monkeypatch.setattr(cache.time, "monotonic", lambda: clock[0])
    hold("r2")
    assert settle("r2") == D("1.92")  # (1 + 0.2) × 1.6


@pytest.mark.django_db
def test_a_change_saved_in_this_process_applies_at_once(world):
    hold("r1")
    Backend.objects.filter(name="gpu-a").update(enabled=False)  # no signal: the cached upper bound stands
    assert hold("r2").amount == D("3.2")
    backend = Backend.objects.get(name="gpu-a")
    backend.save()  # a save in this process (admin, console) drops the caches
    assert hold("r3").amount == D("1.6")  # gpu-b: 0.5 + 0.5 = 1.0 × 1.6


@pytest.mark.django_db
def test_a_hold_rolled_back_is_not_remembered(world):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            hold("ghost")
            raise RuntimeError("the caller's transaction fails")
    assert held_get("ghost") is None
    with pytest.raises(HoldNotFound):
        settle("ghost")


@pytest.mark.django_db
def test_settling_from_another_process_reads_the_hold_from_the_ledger(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        hold("r1")
    assert held_get("r1") is not None
    cache.caches_invalidate()  # also forgets the in-flight holds, as a process that did not admit it
    assert settle("r1") == D("1.12")
    assert settle("r1") == D("1.12")  # and a retry still charges once
    assert LedgerEntry.objects.filter(request_id="r1", kind="charge").count() == 1


@pytest.mark.django_db
def test_a_late_settlement_after_the_stale_sweep_charges_once(world):
    hold("slow", at=timezone.now() - timedelta(hours=3))
    assert holds_release_stale(older_than=timedelta(hours=2)) == 1
    assert settle("slow") == settle("slow") == D("1.12")
    hold_release(request_id="slow", reason="cancelled")  # changes nothing now
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.12"), D("0"))
    assert ledger_mismatches() == []
