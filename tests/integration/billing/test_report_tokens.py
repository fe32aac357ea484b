"""Report tokens: a script reads the report API with its user's scope; API keys never do, and a
token never survives revocation, expiry or its user's deactivation. "Last used" is coalesced."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditLog
from billing.models import LedgerEntry
from tenants.keys import key_generate
from tenants.models import ApiKey, ReportToken, User
from tenants.tokens import token_create
from tests.integration.billing.helpers import hold, settle

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.billing.urls")]


@pytest.fixture
def charged(world):
    for n, tenant in enumerate(("alpha", "alpha", "beta"), start=1):
        hold(f"r{n}", tenant=tenant)
        settle(f"r{n}", completion=40 * n)


def script(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def user(username: str, role: str, tenant=None) -> User:
    return User.objects.create_user(username=username, password="pw-x-12345", role=role, tenant=tenant)


def test_a_finance_token_pulls_every_tenant_as_csv(charged):
    full, _ = token_create(user=user("fay", "finance"), label="monthly", days=30)
    response = script(full).get("/api/billing/charges/", {"format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {r["tenant"] for r in rows} == {"alpha", "beta"}
    total = sum(e.amount for e in LedgerEntry.objects.filter(kind="charge"))
    assert sum(D(r["charge"]) for r in rows) == total


def test_a_member_token_has_the_members_scope(charged, world):
    full, _ = token_create(user=user("ann", "member", world["alpha"]), label="", days=1)
    rows = script(full).get("/api/billing/charges/").json()["rows"]
    assert {r["tenant"] for r in rows} == {"alpha"}
    assert script(full).get("/api/billing/charges/", {"tenant": "beta"}).status_code == 404


def test_an_api_key_never_reads_reports(charged, world):
    full_key, prefix, digest = key_generate()
    ApiKey.objects.create(tenant=world["alpha"], default_class="BATCH", prefix=prefix, secret_hash=digest)
    refused = script(full_key).get("/api/billing/charges/")
    assert refused.status_code in (401, 403) and "not an API key" in refused.json()["detail"]


@pytest.mark.parametrize("how", ["revoked", "expired", "user deactivated", "wrong secret", "unknown"])
def test_a_dead_token_is_refused(charged, how):
    owner = user("fay", "finance")
    full, token = token_create(user=owner, label="", days=30)
    if how == "revoked":
        call_command("reporttoken", "revoke", token.prefix, stdout=io.StringIO())
    elif how == "expired":
        ReportToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    elif how == "user deactivated":
        User.objects.filter(pk=owner.pk).update(is_active=False)
    elif how == "wrong secret":
        full = full[:-4] + ("aaaa" if not full.endswith("aaaa") else "bbbb")
    else:
        full = "fgr_0123456789_" + "x" * 43
    refused = script(full).get("/api/billing/charges/")
    assert refused.status_code in (401, 403) and "unknown, expired or revoked" in refused.json()["detail"]


def test_last_used_is_written_once_a_minute_not_per_request(charged):
    full, token = token_create(user=user("fay", "finance"), label="", days=30)
    client = script(full)
    client.get("/api/billing/alerts/")
    first = ReportToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        client.get("/api/billing/alerts/")
    assert not any("UPDATE" in q["sql"] and "reporttoken" in q["sql"] for q in queries.captured_queries)
    assert ReportToken.objects.get(pk=token.pk).last_used_at == first


def test_the_command_prints_the_token_once_and_audits(world):
    user("fay", "finance")
    out = io.StringIO()
    call_command("reporttoken", "create", "fay", "--label", "monthly csv", "--days", "31", stdout=out)
    full = out.getvalue().strip()
    token = ReportToken.objects.get()
    assert full.startswith(f"fgr_{token.prefix}_") and token.secret_hash not in full and token.label == "monthly csv"
    assert full not in str(token.__dict__)  # only its digest is stored
    entry = AuditLog.objects.get(entity="report_token", action="create")
    assert entry.key == token.prefix and entry.new["user"] == "fay"
    for args, message in (
        (("create", "nobody"), "no user 'nobody'"),
        (("create", "fay", "--days", "0"), "1 to 366 days"),
        (("create", "fay", "--days", "400"), "1 to 366 days"),
        (("revoke", "nope"), "no report token"),
    ):
        with pytest.raises(CommandError, match=message) as refused:
            call_command("reporttoken", *args, stdout=io.StringIO())
        assert refused.value.returncode == 2
