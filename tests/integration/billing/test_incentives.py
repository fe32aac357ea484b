"""Finance's incentive view, the charges' price factor and the burn series, on a ledger whose
traffic moves from the top class to BATCH after the top class's price goes up."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal as D

import pytest

from billing import incentives, reports
from billing.models import LedgerEntry
from billing.price_versions import price_set
from scheduling.models import PriorityClass
from tenants.models import Tenant
from tests.integration.billing.helpers import hold, settle

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.billing.urls")]
MON = datetime(2025, 3, 3, 9, tzinfo=UTC)
CHANGE = datetime(2025, 3, 10, 0, tzinfo=UTC)


@pytest.fixture
def shift(world):
    """INTERACTIVE costs 1.0 until CHANGE, then 1.6. alpha sends 9 INTERACTIVE + 1 BATCH in the
    week before, 2 INTERACTIVE + 8 BATCH in the week after; beta 1 INTERACTIVE before and after."""
    top = PriorityClass.objects.get(name="INTERACTIVE")
    price_set(priority_class=top, price_factor=D("1.0"), actor="fay", effective_at=MON - timedelta(days=1))
    price_set(priority_class=top, price_factor=D("1.6"), actor="fay", effective_at=CHANGE)
    plan = [
        ("alpha", MON, "INTERACTIVE", 9),
        ("alpha", MON, "BATCH", 1),
        ("alpha", CHANGE + timedelta(days=1), "INTERACTIVE", 2),
        ("alpha", CHANGE + timedelta(days=1), "BATCH", 8),
        ("beta", MON, "INTERACTIVE", 1),
        ("beta", CHANGE + timedelta(days=1), "INTERACTIVE", 1),
    ]
    n = 0
    for tenant, at, cls, count in plan:
        for i in range(count):
            n += 1
            when = at + timedelta(minutes=i)
            hold(f"s{n}", tenant=tenant, cls=cls, at=when)
            settle(f"s{n}", at=when + timedelta(seconds=1))  # base 0.7 on gpu-b


def test_price_changes_name_old_and_new_and_skip_first_prices(shift):
    labels = [c.label for c in incentives.price_changes()]
    assert labels == ["INTERACTIVE 1.6 → 1", "INTERACTIVE 1 → 1.6"]


def test_class_shift_shows_the_top_share_falling_and_its_premium(shift):
    since = MON - timedelta(hours=1)
    rows = incentives.class_shift(tenants=Tenant.objects.all(), since=since)
    alpha = {(r["period"], r["class"]): r for r in rows if r["tenant"] == "alpha"}
    assert alpha[(0, "INTERACTIVE")]["request_share"] == D("0.9")
    assert alpha[(1, "INTERACTIVE")]["request_share"] == D("0.2")
    assert alpha[(1, "INTERACTIVE")]["opened_by"] == "INTERACTIVE 1 → 1.6"
    # premium = charge - base: nothing at factor 1, 0.6 of the base after
    assert alpha[(0, "INTERACTIVE")]["premium"] == 0
    base = alpha[(1, "INTERACTIVE")]["base_cost"]
    assert alpha[(1, "INTERACTIVE")]["premium"] == D("0.6") * base == D("0.84")
    assert alpha[(1, "BATCH")]["premium"] < 0  # a discount
    periods = incentives.top_share_by_period(rows)
    assert [p["top_share"] for p in periods] == [D("0.9091"), D("0.2727")]  # 10 of 11, then 3 of 11
    assert periods[1]["top_premium"] == alpha[(1, "INTERACTIVE")]["premium"] + D("0.42")  # beta's one request


def test_charges_show_the_factor_in_force_and_the_ratio_only_where_it_differs(shift):
    rows = reports.charges_by_month(tenants=Tenant.objects.filter(slug="alpha"))
    top = [r for r in rows if r["class"] == "INTERACTIVE"]
    assert sorted(str(r["price_factor"]) for r in top) == ["1", "1.6"]  # one row per factor in the month
    assert all(r["effective_note"] is None for r in rows)  # 0.7 x 1.6 has no rounding here
    tiny = reports._effective_note(
        factor=D("0.7"), effective=D("0.6999"), charge=D("0.000007"), base=D("0.000010"), unbilled=D(0), n=1
    )
    assert "rounded" in tiny
    capped = reports._effective_note(
        factor=D("1.6"), effective=D("1.2045"), charge=D("1.2"), base=D("1"), unbilled=D("0.4"), n=1
    )
    assert capped.startswith("capped at the holds")


def test_class_mix_merges_the_factors_of_a_month(shift):
    rows = reports.class_mix(tenants=Tenant.objects.filter(slug="alpha"))
    assert {r["class"]: r["requests"] for r in rows} == {"INTERACTIVE": 11, "BATCH": 9}
    assert sum(r["request_share"] for r in rows) == 1


def test_spend_series_steps_to_the_span_and_runs_up_to_the_ledger(shift):
    step, rows = reports.spend_series(tenants=Tenant.objects.all())
    assert step == "day"  # eight days of charges
    alpha = [r for r in rows if r["tenant"] == "alpha"]
    total = sum(e.amount for e in LedgerEntry.objects.filter(tenant__slug="alpha", kind="charge"))
    assert alpha[-1]["cumulative"] == total and len(alpha) == 2
    assert reports.series_step(first=MON, last=MON + timedelta(minutes=30)) == "minute"


def test_incentive_and_series_over_http_csv_and_scoped(shift, finance, member_b):
    body = finance.get("/api/billing/class-shift/", {"since": "2025-03-03"}).json()
    assert body["top_class"] == "INTERACTIVE" and body["changes"][0]["new"] == "1.6"
    assert [p["top_share"] for p in body["periods"]] == ["0.9091", "0.2727"]
    response = finance.get("/api/billing/class-shift/", {"format": "csv", "since": "2025-03-03"})
    assert "class-shift.csv" in response["Content-Disposition"]
    assert {r["tenant"] for r in csv.DictReader(io.StringIO(response.content.decode()))} == {"alpha", "beta"}
    assert {r["tenant"] for r in member_b.get("/api/billing/class-shift/").json()["rows"]} == {"beta"}
    assert member_b.get("/api/billing/burn-series/", {"tenant": "alpha"}).status_code == 404
    series = finance.get("/api/billing/burn-series/", {"format": "csv"})
    assert series.status_code == 200 and "burn-series.csv" in series["Content-Disposition"]


def test_share_series_is_per_day_with_every_bucket_and_its_volume(shift):
    """Issue 49: share per class per day (not one column per price change), with each day's
    volume, empty days between included (the chart shows volume falling, not a class emptying)."""
    step, rows = incentives.share_series(tenants=Tenant.objects.all())
    assert step == "day"
    days = sorted({r["at"] for r in rows})
    assert len(days) == ((CHANGE + timedelta(days=1)).date() - MON.date()).days + 1  # every day, first to last
    by = {(r["at"].date().isoformat(), r["class"]): r for r in rows}
    first, last = MON.date().isoformat(), (CHANGE + timedelta(days=1)).date().isoformat()
    assert (by[(first, "INTERACTIVE")]["requests"], by[(first, "INTERACTIVE")]["bucket_requests"]) == (10, 11)
    assert by[(first, "INTERACTIVE")]["share"] == D("0.9091") and by[(last, "INTERACTIVE")]["share"] == D("0.2727")
    quiet = [r for r in rows if r["bucket_requests"] == 0]
    assert quiet and all(r["share"] is None for r in quiet)  # no traffic that day: no share, not 0 %
    for day in days:  # each day's shares cover all of its requests
        cells = [r for r in rows if r["at"] == day]
        assert sum(r["requests"] for r in cells) == cells[0]["bucket_requests"]


def test_class_shift_api_gives_the_series_and_the_changes_on_its_axis(shift, finance):
    body = finance.get("/api/billing/class-shift/", {"since": "2025-03-03"}).json()
    assert body["step"] == "day" and body["series"]
    assert [c["at"][:10] for c in body["changes"]] == [CHANGE.date().isoformat()]
    assert isinstance(body["series"][0]["share"], str | None)  # decimals travel as text
