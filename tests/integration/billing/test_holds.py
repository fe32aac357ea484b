"""Admission holds: the upper-bound amount, refusal at the budget's edge, idempotency, caps."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal as D

import pytest

from billing.errors import BudgetExhausted, UnknownClass, UnknownModel, UnknownTenant
from billing.models import Budget, LedgerEntry, TenantBilling
from billing.selectors import budget_fallback_class
from tests.integration.billing.helpers import hold, kinds, year_budget

pytestmark = pytest.mark.django_db


def test_hold_is_the_dearest_enabled_backend_times_the_class_factor(world):
    result = hold("r1")
    assert result.amount == D("3.200000")  # gpu-a (2.0 base), not the disabled gpu-x
    assert result.factor == D("1.6") and result.class_name == "INTERACTIVE"
    budget = year_budget("alpha")
    assert (result.budget_id, budget.held, budget.spent) == (budget.pk, D("3.2"), D("0"))
    assert kinds("r1") == {"hold": D("3.2")}


def test_hold_keeps_six_decimal_places(world):
    assert hold("tiny", prompt=1, max_out=0).amount == D("0.001600")  # 1 token: 0.001 × 1.6


def test_hold_refused_when_it_does_not_fit_names_budget_remaining_and_need(world):
    world["alpha"].annual_budget = D("5")
    world["alpha"].save()
    hold("r1")  # 3.2 of 5
    with pytest.raises(BudgetExhausted) as info:
        hold("r2")
    error = info.value
    assert (error.remaining, error.needed) == (D("1.8"), D("3.2"))
    assert "alpha FY" in error.budget_label and "1.8" in str(error) and "3.2" in str(error)
    assert not LedgerEntry.objects.filter(request_id="r2").exists()  # nothing recorded for a refusal
    assert year_budget("alpha").held == D("3.2")


def test_hold_exactly_at_the_edge_fits(world):
    world["alpha"].annual_budget = D("6.4")
    world["alpha"].save()
    hold("r1"), hold("r2")
    assert year_budget("alpha").remaining == D("0")
    with pytest.raises(BudgetExhausted):
        hold("r3", prompt=1, max_out=0)


def test_hold_is_idempotent_per_request_id(world):
    first = hold("r1")
    again = hold("r1", prompt=99999)
    assert again == first
    assert year_budget("alpha").held == D("3.2")
    assert LedgerEntry.objects.filter(request_id="r1").count() == 1


def test_a_hold_repeated_at_the_budget_edge_returns_the_first(world):
    world["alpha"].annual_budget = D("3.2")
    world["alpha"].save()
    first = hold("r1")  # takes the whole budget
    assert hold("r1") == first  # the repeat does not fit any more, yet is no refusal
    assert year_budget("alpha").held == D("3.2")
    with pytest.raises(BudgetExhausted):
        hold("r2")


def test_unlimited_tenant_still_records_holds(world):
    hold("g1", tenant="gamma", prompt=10**7)
    budget = year_budget("gamma")
    assert budget.limit is None and budget.held > 0 and budget.remaining is None


def test_monthly_cap_refuses_before_the_year_does(world):
    TenantBilling.objects.create(tenant=world["alpha"], monthly_cap=D("4"))
    hold("r1")
    with pytest.raises(BudgetExhausted) as info:
        hold("r2")
    assert "month" in info.value.budget_label
    month = Budget.objects.get(tenant__slug="alpha", kind=Budget.Kind.MONTH)
    assert month.held == D("3.2") and year_budget("alpha").held == D("3.2")


def test_budget_follows_a_changed_annual_budget(world):
    hold("r1")
    world["alpha"].annual_budget = D("2")
    world["alpha"].save()
    with pytest.raises(BudgetExhausted):
        hold("r2", prompt=1, max_out=0)
    assert year_budget("alpha").limit == D("2")


def test_fiscal_year_budget_uses_start_month_and_time_zone(world, settings):
    settings.FAIRGATE_FISCAL_YEAR_START_MONTH = 4
    settings.FAIRGATE_FISCAL_TZ = "Asia/Shanghai"
    # 31 March 2025 17:00 UTC is already 1 April 01:00 in Shanghai: FY2025 there
    hold("late", at=datetime(2025, 3, 31, 17, 0, tzinfo=UTC))
    hold("early", at=datetime(2025, 3, 31, 15, 0, tzinfo=UTC))
    years = dict(Budget.objects.values_list("fiscal_year", "held"))
    assert years == {2025: D("3.2"), 2024: D("3.2")}


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"tenant": "nobody"}, UnknownTenant),
        ({"cls": "GOLD"}, UnknownClass),
        ({"model": "zzz"}, UnknownModel),
    ],
)
def test_hold_refuses_unknown_names(world, kwargs, error):
    with pytest.raises(error):
        hold("r1", **kwargs)


def test_fallback_class_is_the_first_cheaper_class_that_fits(world):
    TenantBilling.objects.create(tenant=world["alpha"], fallback_on_exhausted=True)
    world["alpha"].annual_budget = D("1.5")  # INTERACTIVE 3.2, NEAR_RT 2.4, BATCH 1.4, RETRY 0.8
    world["alpha"].save()
    args = dict(tenant_slug="alpha", class_name="INTERACTIVE", model="m", prompt_tokens=1000, max_output_tokens=500)
    assert budget_fallback_class(**args) == "BATCH"
    world["alpha"].allowed_classes = ["INTERACTIVE", "RETRY"]
    world["alpha"].save()
    assert budget_fallback_class(**args) == "RETRY"


def test_no_fallback_unless_configured_or_nothing_fits(world):
    args = dict(tenant_slug="alpha", class_name="INTERACTIVE", model="m", prompt_tokens=1000, max_output_tokens=500)
    assert budget_fallback_class(**args) is None  # not configured
    TenantBilling.objects.create(tenant=world["alpha"], fallback_on_exhausted=True)
    world["alpha"].annual_budget = D("0.5")
    world["alpha"].save()
    assert budget_fallback_class(**args) is None  # RETRY needs 0.8


def test_edge_arithmetic_is_exact_decimal(world):
    world["alpha"].annual_budget = D("0.3")
    world["alpha"].save()
    for n in range(3):  # RETRY: 250 tokens × 1/1k × 0.4 = 0.1 each; 0.1 + 0.1 + 0.1 is not 0.3 in floats
        hold(f"r{n}", cls="RETRY", prompt=250, max_out=0)
    assert year_budget("alpha").held == D("0.3") and year_budget("alpha").remaining == 0


def test_negative_token_counts_are_refused(world):
    from billing.errors import BillingError

    with pytest.raises(BillingError):
        hold("neg", prompt=-1)
