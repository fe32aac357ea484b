"""Who spent: every ledger entry of a request records its key's prefix, its job and its key's
creator, written by the booking's bulk append (COPY on PostgreSQL); the spend report sums them by
tenant × class × key, by job and by creator, exactly as the ledger does; a report token pulls the
CSV by key."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from billing.booking import book
from billing.booking_asks import HoldAsk, SettleAsk
from billing.inflight import HeldEntry, held_get
from billing.models import LedgerEntry
from billing.selectors import ledger_mismatches
from tenants.models import ApiKey, User
from tenants.tokens import token_create
from tests.integration.billing.helpers import settle
from tests.integration.billing.test_report_tokens import script

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.billing.urls")]


def spend_hold(rid: str, *, key: str, job: str = "", creator: str = "", tenant: str = "alpha", cls="INTERACTIVE"):
    [held] = book(
        [
            HoldAsk(
                request_id=rid,
                tenant_slug=tenant,
                class_name=cls,
                model="m",
                prompt_tokens=1000,
                max_output_tokens=500,
                at=timezone.now(),
                key_prefix=key,
                job_id=job,
                key_creator=creator,
            )
        ]
    )
    assert isinstance(held, HeldEntry)
    return held


def spenders(rid: str) -> dict[str, tuple[str, str, str]]:
    rows = LedgerEntry.objects.filter(request_id=rid).values_list("kind", "key_prefix", "job_id", "key_creator")
    return {kind: (key, job, creator) for kind, key, job, creator in rows}


def test_hold_release_and_charge_record_the_key_job_and_creator(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        held = spend_hold("s1", key="fg1aaaa", job="nightly-7", creator="carol")
    # ended with the hold it booked (the serving process's memo), and read back from the ledger
    book(
        [
            SettleAsk(
                request_id="s1",
                backend_name="gpu-b",
                prompt_tokens=1000,
                completion_tokens=200,
                at=timezone.now(),
                held=held,
            )
        ]
    )
    assert spenders("s1") == {kind: ("fg1aaaa", "nightly-7", "carol") for kind in ("hold", "release", "charge")}
    with django_capture_on_commit_callbacks(execute=True):
        spend_hold("s2", key="fg1bbbb", job="", creator="cli")
    assert held_get("s2") is not None and held_get("s2").key_creator == "cli"
    settle("s2")  # another process's settlement: the hold read from the ledger, its spender too
    assert spenders("s2") == {kind: ("fg1bbbb", "", "cli") for kind in ("hold", "release", "charge")}
    assert ledger_mismatches() == []


@pytest.mark.postgres
def test_the_columns_go_in_by_copy_on_postgresql(world, django_capture_on_commit_callbacks):
    """The bulk path (statements._copy_rows) takes the new columns, text that COPY escapes too."""
    assert connection.vendor == "postgresql"
    with django_capture_on_commit_callbacks(execute=True):
        held = [spend_hold(f"c{n}", key="fg1cccc", job=f"job\t{n}\\N", creator="ütf-8 user") for n in range(3)]
    book(
        [
            SettleAsk(
                request_id=h.request_id,
                backend_name="gpu-b",
                prompt_tokens=10,
                completion_tokens=2,
                at=timezone.now(),
                held=h,
            )
            for h in held
        ]
    )
    for n in range(3):
        assert set(spenders(f"c{n}").values()) == {("fg1cccc", f"job\t{n}\\N", "ütf-8 user")}


def test_an_apikey_records_its_console_creator_and_a_rotation_keeps_it(world):
    from tenants.services import apikey_create, apikey_rotate

    key, _ = apikey_create(tenant_slug="alpha", default_class="BATCH", actor="console:carol", known_classes=["BATCH"])
    assert key.created_by == "carol"
    new, _ = apikey_rotate(prefix=key.prefix, grace=timedelta(hours=1), actor="console:dave")
    assert new.created_by == "carol"
    cli, _ = apikey_create(tenant_slug="alpha", default_class="BATCH", actor="cli", known_classes=["BATCH"])
    assert ApiKey.objects.get(pk=cli.pk).created_by == "cli"


@pytest.fixture
def spent(world, django_capture_on_commit_callbacks):
    """Charges of two tenants, several keys, classes and jobs, and one row from before the columns."""
    plan = [
        ("alpha", "INTERACTIVE", "fg1k1", "carol", "j1", 200),
        ("alpha", "INTERACTIVE", "fg1k1", "carol", "j1", 300),
        ("alpha", "BATCH", "fg1k1", "carol", "j2", 100),
        ("alpha", "INTERACTIVE", "fg1k2", "dave", "j2", 50),
        ("alpha", "INTERACTIVE", "fg1k2", "dave", "", 70),
        ("beta", "NEAR_RT", "fg1k3", "erin", "j1", 80),
        ("alpha", "INTERACTIVE", "", "", "", 90),  # as booked before keys were recorded
    ]
    for n, (tenant, cls, key, creator, job, completion) in enumerate(plan):
        with django_capture_on_commit_callbacks(execute=True):
            spend_hold(f"p{n}", key=key, job=job, creator=creator, tenant=tenant, cls=cls)
        settle(f"p{n}", completion=completion)
    ApiKey.objects.create(
        tenant=world["alpha"], label="nightly", default_class="BATCH", prefix="fg1k1", secret_hash="x" * 64
    )


def ledger_sum(**filters) -> tuple[int, D]:
    charges = LedgerEntry.objects.filter(kind="charge", **filters)
    return charges.count(), charges.aggregate(t=Sum("amount"))["t"] or D(0)


def test_spend_by_tenant_class_and_key_adds_up_to_the_ledger(spent, finance):
    body = finance.get("/api/billing/spend/", {"group_by": "key"}).json()
    assert body["group_by"] == "key"
    rows = {(r["tenant"], r["class"], r["key_prefix"]): r for r in body["rows"]}
    assert set(rows) == {
        ("alpha", "BATCH", "fg1k1"),
        ("alpha", "INTERACTIVE", ""),
        ("alpha", "INTERACTIVE", "fg1k1"),
        ("alpha", "INTERACTIVE", "fg1k2"),
        ("beta", "NEAR_RT", "fg1k3"),
    }
    for (tenant, cls, key), row in rows.items():
        count, total = ledger_sum(tenant__slug=tenant, class_name=cls, key_prefix=key)
        assert (row["requests"], D(row["charge"])) == (count, total)
    assert rows["alpha", "INTERACTIVE", "fg1k1"]["requests"] == 2
    assert rows["alpha", "INTERACTIVE", "fg1k1"]["key_creator"] == "carol"
    assert rows["alpha", "INTERACTIVE", "fg1k1"]["key_label"] == "nightly"
    assert sum(D(r["charge"]) for r in body["rows"]) == ledger_sum()[1]


def test_spend_by_job_and_by_creator_add_up_to_the_ledger(spent, finance):
    rows = finance.get("/api/billing/spend/", {"group_by": "job"}).json()["rows"]
    by_job = {(r["tenant"], r["job"]): r for r in rows}
    assert set(by_job) == {("alpha", "j1"), ("alpha", "j2"), ("alpha", ""), ("beta", "j1")}
    for (tenant, job), row in by_job.items():
        assert (row["requests"], D(row["charge"])) == ledger_sum(tenant__slug=tenant, job_id=job)
    assert by_job["alpha", "j2"]["requests"] == 2  # two keys, two classes: one job
    creators = finance.get("/api/billing/spend/", {"group_by": "creator"}).json()["rows"]
    assert {(r["tenant"], r["key_creator"]): r["requests"] for r in creators} == {
        ("alpha", "carol"): 3,
        ("alpha", "dave"): 2,
        ("alpha", ""): 1,
        ("beta", "erin"): 1,
    }
    one = finance.get("/api/billing/spend/", {"group_by": "job", "job": "j1"}).json()["rows"]
    assert {r["tenant"] for r in one} == {"alpha", "beta"}


def test_spend_over_a_period_and_scoped_to_a_member(spent, member_a):
    rows = member_a.get("/api/billing/spend/", {"group_by": "key"}).json()["rows"]
    assert {r["tenant"] for r in rows} == {"alpha"}
    assert member_a.get("/api/billing/spend/", {"tenant": "beta"}).status_code == 404
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()
    assert member_a.get("/api/billing/spend/", {"since": tomorrow}).json()["rows"] == []
    assert member_a.get("/api/billing/spend/", {"group_by": "model"}).status_code == 400


def test_a_report_token_pulls_spend_by_key_as_csv(spent):
    user = User.objects.create_user(username="fin", password="pw-x-12345", role="finance")
    full, _ = token_create(user=user, label="by key", days=30)
    response = script(full).get("/api/billing/spend/", {"group_by": "key", "format": "csv", "tenant": "alpha"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="spend-by-key.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [c for c in rows[0]][:5] == ["tenant", "class", "key_prefix", "key_label", "key_creator"]
    for row in rows:
        count, total = ledger_sum(tenant__slug="alpha", class_name=row["class"], key_prefix=row["key_prefix"])
        assert (int(row["requests"]), D(row["charge"])) == (count, total)
    assert sum(D(r["charge"]) for r in rows) == ledger_sum(tenant__slug="alpha")[1]


def test_a_job_that_looks_like_a_formula_is_neutralised_in_the_csv(world, finance, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        spend_hold("f1", key="fg1k9", job="=HYPERLINK(1)", creator="carol")
    settle("f1")
    text = finance.get("/api/billing/spend/", {"group_by": "job", "format": "csv"}).content.decode()
    assert "'=HYPERLINK(1)" in text


def test_the_ledger_endpoint_shows_and_filters_the_columns(spent, finance):
    rows = finance.get("/api/billing/ledger/", {"key_prefix": "fg1k2", "kind": "charge"}).json()["rows"]
    assert len(rows) == 2 and {(r["key_creator"], r["job_id"]) for r in rows} == {("dave", "j2"), ("dave", "")}
    assert len(finance.get("/api/billing/ledger/", {"job_id": "j1"}).json()["rows"]) == 9  # 3 requests × 3 entries
