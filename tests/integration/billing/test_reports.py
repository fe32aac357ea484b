"""Finance reports add up to the ledger to the cent; CSV export; tenant isolation by persona."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal as D

import pytest
from django.db.models import Sum

from billing import reports
from billing.models import LedgerEntry
from billing.services import hold_release, ledger_adjust
from tenants.models import Tenant
from tests.integration.billing.helpers import hold, settle

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.billing.urls")]
JAN = datetime(2025, 1, 15, 12, tzinfo=UTC)
FEB = datetime(2025, 2, 10, 12, tzinfo=UTC)


@pytest.fixture
def traffic(world):
    """alpha: Jan 3 INTERACTIVE + 1 BATCH, Feb 1 INTERACTIVE + 2 BATCH; beta: one of each in Jan."""
    plan = [
        ("alpha", JAN, "INTERACTIVE", 3),
        ("alpha", JAN, "BATCH", 1),
        ("alpha", FEB, "INTERACTIVE", 1),
        ("alpha", FEB, "BATCH", 2),
        ("beta", JAN, "INTERACTIVE", 1),
        ("beta", JAN, "BATCH", 1),
    ]
    n = 0
    for tenant, at, cls, count in plan:
        for _ in range(count):
            n += 1
            hold(f"q{n}", tenant=tenant, cls=cls, at=at)
            settle(f"q{n}", completion=n * 37, at=at + timedelta(seconds=1))  # odd amounts
    hold("cancelled", at=JAN)
    hold_release(request_id="cancelled", reason="cancelled")
    hold("in-flight", at=FEB)
    ledger_adjust(tenant_slug="alpha", amount=D("-0.333333"), reason="goodwill", author="fay", at=FEB)


def ledger_charges(**filters) -> D:
    return LedgerEntry.objects.filter(kind="charge", **filters).aggregate(t=Sum("amount"))["t"] or D(0)


def test_charges_report_adds_up_to_the_ledger(traffic):
    rows = reports.charges_by_month(tenants=Tenant.objects.all())
    assert sum(r["charge"] for r in rows) == ledger_charges()
    assert sum(r["requests"] for r in rows) == LedgerEntry.objects.filter(kind="charge").count() == 9
    jan_alpha = next(r for r in rows if (r["tenant"], r["month"], r["class"]) == ("alpha", "2025-01", "INTERACTIVE"))
    assert jan_alpha["requests"] == 3 and jan_alpha["effective_multiplier"] == D("1.6")
    assert jan_alpha["charge"] == ledger_charges(tenant__slug="alpha", class_name="INTERACTIVE", at__lt=FEB)


def test_burn_adds_up_to_the_ledger_and_projects_the_year(traffic):
    rows = {
        r["tenant"]: r
        for r in reports.budget_burn(
            tenants=Tenant.objects.all(), fiscal_year=2025, now=datetime(2025, 7, 2, 12, tzinfo=UTC)
        )
    }
    alpha = rows["alpha"]
    assert alpha["spent"] == ledger_charges(tenant__slug="alpha") - D("0.333333")
    assert alpha["held"] == D("3.2")  # the in-flight hold only
    assert alpha["remaining"] == D("1000") - alpha["spent"] - alpha["held"]
    assert alpha["projected_spend"] == pytest.approx(alpha["spent"] * 2, rel=D("0.01"))  # half the year gone
    assert rows["gamma"]["spent"] == 0 and rows["gamma"]["remaining"] is None


def test_burn_without_overrun_reads_the_budget_rows_only(traffic):
    """The console's budget bar (refreshed every few seconds under traffic) must not sum the ledger."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    when = {"tenants": Tenant.objects.all(), "fiscal_year": 2025, "now": datetime(2025, 7, 2, 12, tzinfo=UTC)}
    full = reports.budget_burn(**when)
    with CaptureQueriesContext(connection) as queries:
        lean = reports.budget_burn(**when, with_overrun=False)
    assert lean == [{k: v for k, v in row.items() if k != "overrun"} for row in full]
    assert not [q["sql"] for q in queries.captured_queries if LedgerEntry._meta.db_table in q["sql"]]


def test_class_mix_shares_add_to_one_per_tenant_month(traffic):
    rows = reports.class_mix(tenants=Tenant.objects.filter(slug="alpha"))
    jan = {r["class"]: r for r in rows if r["month"] == "2025-01"}
    assert jan["INTERACTIVE"]["request_share"] == D("0.75") and jan["BATCH"]["request_share"] == D("0.25")
    for month in ("2025-01", "2025-02"):
        assert sum(r["spend_share"] for r in rows if r["month"] == month) == pytest.approx(D(1), abs=D("0.0002"))


def test_what_if_reprices_the_moved_share_at_the_batch_factor(traffic):
    alpha = Tenant.objects.get(slug="alpha")
    period = dict(tenant=alpha, since=datetime(2025, 1, 1, tzinfo=UTC), until=datetime(2026, 1, 1, tzinfo=UTC))
    none = reports.what_if(share=D("0"), **period)
    assert none["what_if"] == none["actual"] == ledger_charges(tenant__slug="alpha")
    half = reports.what_if(share=D("0.5"), **period)
    interactive = LedgerEntry.objects.filter(tenant=alpha, kind="charge", class_name="INTERACTIVE")
    base = interactive.aggregate(t=Sum("base_cost"))["t"]
    assert half["what_if"] == (half["actual"] - D("0.5") * base * D("1.6") + D("0.5") * base * D("0.7")).quantize(
        D("0.000001")
    )
    assert half["saving"] > 0


def test_reports_over_http_and_csv(traffic, finance):
    body = finance.get("/api/billing/charges/").json()
    assert body["currency"] == "USD" and isinstance(body["rows"][0]["charge"], str)  # exact decimals, never floats
    assert sum(D(r["charge"]) for r in body["rows"]) == ledger_charges()
    response = finance.get("/api/billing/charges/", {"format": "csv"})
    assert response["Content-Type"].startswith("text/csv") and "charges.csv" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert sum(D(r["charge"]) for r in rows) == ledger_charges()
    for url in ("burn", "class-mix", "ledger", "alerts"):
        assert finance.get(f"/api/billing/{url}/", {"format": "csv"}).status_code == 200
    what_if = finance.get(
        "/api/billing/what-if/", {"tenant": "alpha", "share_pct": "50", "since": "2025-01-01", "until": "2026-01-01"}
    ).json()["rows"][0]
    assert D(what_if["share"]) == D("0.5")
    assert finance.get("/api/billing/what-if/", {"share_pct": "50"}).status_code == 400  # which tenant?
    assert finance.get("/api/billing/what-if/", {"tenant": "alpha", "share_pct": "150"}).status_code == 400


def tenants_in(client, url: str, **params) -> set[str]:
    response = client.get(f"/api/billing/{url}/", params)
    assert response.status_code == 200, response.content
    return {row["tenant"] for row in response.json()["rows"]}


@pytest.mark.parametrize("url", ["charges", "burn", "class-mix", "ledger"])
def test_members_see_only_their_tenant(traffic, member_a, teammate_a, member_b, finance, admin_user, url):
    assert tenants_in(member_a, url) == tenants_in(teammate_a, url) == {"alpha"}
    assert tenants_in(member_b, url) == {"beta"}
    assert {"alpha", "beta"} <= tenants_in(finance, url) == tenants_in(admin_user, url)
    assert member_b.get(f"/api/billing/{url}/", {"tenant": "alpha"}).status_code == 404
    assert member_b.get(f"/api/billing/{url}/", {"tenant": "alpha", "format": "csv"}).status_code == 404
    assert member_b.get(f"/api/billing/{url}/", {"tenant": "nosuch"}).status_code == 404
    assert tenants_in(finance, url, tenant="alpha") == {"alpha"}


def test_member_cannot_what_if_another_tenant_and_anonymous_is_refused(traffic, member_b, client):
    assert member_b.get("/api/billing/what-if/", {"tenant": "alpha"}).status_code == 404
    assert member_b.get("/api/billing/what-if/").json()["rows"][0]["tenant"] == "beta"
    assert client.get("/api/billing/charges/").status_code == 403


def test_class_mix_for_all_tenants_is_shares_of_the_whole_set_as_in_the_ledger(traffic, finance):
    """Issue 49: the chart's data for "all" (the API's ``overall``) is each class's share of every
    request that month, counted here straight from the ledger (not the tenants' shares averaged)."""
    body = finance.get("/api/billing/class-mix/").json()
    overall = {(r["month"], r["class"]): r for r in body["overall"]}
    charges = LedgerEntry.objects.filter(kind="charge")
    for month, start, end in (
        ("2025-01", JAN.replace(day=1), FEB.replace(day=1)),
        ("2025-02", FEB.replace(day=1), None),
    ):
        in_month = charges.filter(at__gte=start) if end is None else charges.filter(at__gte=start, at__lt=end)
        total, spend = in_month.count(), in_month.aggregate(t=Sum("amount"))["t"]
        for cls in ("INTERACTIVE", "BATCH"):
            of_class = in_month.filter(class_name=cls)
            row = overall[(month, cls)]
            assert row["requests"] == of_class.count()
            assert D(row["request_share"]) == (D(of_class.count()) / total).quantize(D("0.0001"))
            assert D(row["spend_share"]) == (of_class.aggregate(t=Sum("amount"))["t"] / spend).quantize(D("0.0001"))
        assert sum(D(overall[(month, c)]["request_share"]) for c in ("INTERACTIVE", "BATCH")) == pytest.approx(
            1, abs=0.001
        )
    # January: alpha 3 of 4 INTERACTIVE, beta 1 of 2; the whole set 4 of 6 (an average would say 62.5 %)
    assert D(overall[("2025-01", "INTERACTIVE")]["request_share"]) == D("0.6667")
