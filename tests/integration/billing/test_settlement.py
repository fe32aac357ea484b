"""Settlement and release: charged once, at the admission price; never for refused/cancelled work."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.utils import timezone

from billing.errors import BillingError, HoldNotFound
from billing.heartbeats import holds_release_unowned
from billing.models import LedgerEntry, PriceVersion
from billing.selectors import ledger_mismatches
from billing.services import hold_release, ledger_adjust, price_change
from scheduling.prices import PriceRefused
from tests.integration.billing.helpers import hold, kinds, settle, year_budget

pytestmark = pytest.mark.django_db


def test_settle_charges_actual_usage_on_the_dispatched_backend_and_releases_the_hold(world):
    hold("r1")
    charge = settle("r1")  # gpu-b, 1000 in + 200 out: 0.7 base × 1.6
    assert charge == D("1.120000")
    budget = year_budget("alpha")
    assert (budget.spent, budget.held, budget.remaining) == (D("1.12"), D("0"), D("998.88"))
    assert kinds("r1") == {"hold": D("3.2"), "release": D("3.2"), "charge": D("1.12")}
    entry = LedgerEntry.objects.get(request_id="r1", kind="charge")
    assert (entry.backend_name, entry.prompt_tokens, entry.completion_tokens, entry.base_cost, entry.factor) == (
        "gpu-b",
        1000,
        200,
        D("0.7"),
        D("1.6"),
    )


def test_settlement_applied_twice_charges_once(world):
    hold("r1")
    assert settle("r1") == settle("r1") == D("1.12")
    assert settle("r1", completion=5000) == D("1.12")  # a retry with other numbers changes nothing
    assert year_budget("alpha").spent == D("1.12")
    assert LedgerEntry.objects.filter(request_id="r1", kind="charge").count() == 1


@pytest.mark.parametrize("reason", ["refused", "queue_timeout", "cancelled", "upstream_error"])
def test_released_requests_are_never_charged(world, reason):
    hold("r1")
    hold_release(request_id="r1", reason=reason)
    hold_release(request_id="r1", reason=reason)  # idempotent
    assert settle("r1") == D("0")  # even a stray settlement afterwards charges nothing
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("0"), D("0"))
    assert kinds("r1") == {"hold": D("3.2"), "release": D("3.2")}


def test_release_of_a_request_never_held_is_a_no_op(world):
    hold_release(request_id="refused-at-the-door", reason="refused")
    assert not LedgerEntry.objects.exists()


def test_release_after_settlement_changes_nothing(world):
    hold("r1")
    settle("r1")
    hold_release(request_id="r1", reason="cancelled")
    assert year_budget("alpha").spent == D("1.12")
    assert LedgerEntry.objects.filter(request_id="r1").count() == 3


def test_settle_without_a_hold_is_an_error(world):
    with pytest.raises(HoldNotFound):
        settle("ghost")


def test_abandoned_stream_is_charged_for_the_tokens_produced(world):
    hold("r1")
    assert settle("r1", completion=40) == D("0.864000")  # (0.5 + 0.04) × 1.6


def test_usage_beyond_the_hold_is_not_charged_but_recorded_as_unbilled(world):
    hold("r1", max_out=10)  # gpu-a: 1 + 0.02 = 1.02 × 1.6 = 1.632
    charge = settle("r1", backend="gpu-a", prompt=1100, completion=10)  # the backend counted more: 1.12 × 1.6
    assert charge == D("1.632")  # the hold, not 1.792
    entry = LedgerEntry.objects.get(request_id="r1", kind="charge")
    assert (entry.amount, entry.unbilled, entry.overrun) == (D("1.632"), D("0.16"), D("0"))
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.632"), D("0"))
    assert ledger_mismatches() == []


def test_a_budget_is_never_overspent_by_a_backend_reporting_more_than_was_held(world):
    from tenants.models import Tenant

    Tenant.objects.filter(slug="alpha").update(annual_budget=D("3.2"))  # room for exactly one hold
    hold("r1")
    assert settle("r1", backend="gpu-a", prompt=200_000, completion=5_000) == D("3.2")
    budget = year_budget("alpha")
    assert budget.spent + budget.held <= budget.limit
    assert LedgerEntry.objects.get(request_id="r1", kind="charge").unbilled == D("332.8")  # (200 + 10) × 1.6 - 3.2


def test_a_late_settlement_after_its_process_was_taken_for_dead_charges_only_what_the_budget_has(world):
    from billing.booking_asks import OWNER_GONE_REASON
    from tenants.models import Tenant

    Tenant.objects.filter(slug="alpha").update(annual_budget=D("4"))
    hold("r1")
    hold_release(request_id="r1", reason=OWNER_GONE_REASON)  # the sweep gave the hold back
    hold("r2")  # someone else used the room meanwhile: 0.8 left
    assert settle("r1") == D("0.8")  # 1.12 priced, 0.8 charged, 0.32 unbilled
    entry = LedgerEntry.objects.get(request_id="r1", kind="charge")
    assert (entry.amount, entry.unbilled) == (D("0.8"), D("0.32"))
    budget = year_budget("alpha")
    assert budget.spent + budget.held == budget.limit
    assert ledger_mismatches() == []


def test_price_change_mid_flight_charges_in_flight_requests_at_their_admission_price(world):
    hold("before")
    version = price_change(class_name="INTERACTIVE", price_factor=D("3"), actor="cfo")
    hold("after")
    assert settle("before") == D("1.12")  # 0.7 × 1.6, the version in force at admission
    assert settle("after") == D("2.1")  # 0.7 × 3
    assert LedgerEntry.objects.get(request_id="after", kind="hold").price_version == version


def test_future_price_change_takes_effect_at_its_time_and_keeps_history(world):
    later = timezone.now() + timedelta(hours=1)
    price_change(class_name="BATCH", price_factor=D("0.5"), effective_at=later, actor="cfo")
    assert hold("now", cls="BATCH").factor == D("0.7")
    assert hold("then", cls="BATCH", at=later + timedelta(seconds=1)).factor == D("0.5")
    assert PriceVersion.objects.filter(priority_class__name="BATCH").count() == 2
    from audit.models import AuditLog

    (change,) = AuditLog.objects.filter(actor="cfo", action="price", key="BATCH")
    assert (change.old, change.new) == ("0.7", "0.5")  # old → new: the factor in force until then


@pytest.mark.parametrize(
    "kwargs",
    [
        {"price_factor": D("-1")},
        {"price_factor": D("1.23456")},
        {"price_factor": D("1"), "effective_at": timezone.now() - timedelta(days=1)},
    ],
)
def test_price_change_refuses_bad_input(world, kwargs):
    with pytest.raises(PriceRefused):  # scheduling.prices: the check every door uses
        price_change(class_name="BATCH", actor="cfo", **kwargs)


def test_unowned_sweep_releases_only_old_unreleased_holds(world):
    old = timezone.now() - timedelta(hours=3)
    hold("crashed", at=old)
    hold("settled", at=old)
    settle("settled")
    hold("fresh")
    assert holds_release_unowned(older_than=timedelta(hours=2)) == 1
    assert holds_release_unowned(older_than=timedelta(hours=2)) == 0
    assert year_budget("alpha").held == D("3.2")  # only "fresh" still held
    assert LedgerEntry.objects.get(request_id="crashed", kind="release").reason == "stale"


def test_a_late_settlement_after_the_sweep_still_charges_what_was_consumed(world):
    hold("slow", at=timezone.now() - timedelta(hours=3))
    holds_release_unowned(older_than=timedelta(hours=2))
    assert settle("slow") == D("1.12")
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.12"), D("0"))


def test_adjustment_moves_spent_and_needs_reason_and_author(world):
    hold("r1")
    settle("r1")
    entry = ledger_adjust(tenant_slug="alpha", amount=D("-1.12"), reason="refund: outage", author="fay")
    assert (entry.kind, entry.reason, entry.author) == ("adjustment", "refund: outage", "fay")
    assert year_budget("alpha").spent == D("0")
    with pytest.raises(BillingError):
        ledger_adjust(tenant_slug="alpha", amount=D("1"), reason=" ", author="fay")
    with pytest.raises(BillingError):
        ledger_adjust(tenant_slug="alpha", amount=D("0.0000001"), reason="x", author="fay")
