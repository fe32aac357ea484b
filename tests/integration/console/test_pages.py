"""Every console page and read API, per persona: who may open what, and B sees nothing of A."""

from __future__ import annotations

import pytest

from tenants.models import ApiKey
from tests.integration.console.conftest import A_REQUEST, B_REQUEST, A

PAGES = ["/console/queue/", "/console/finance/", "/console/policy/", "/console/ops/", "/console/audit/"]
ALLOWED = {
    "member": {"/console/queue/"},
    "finance": {"/console/finance/"},
    "admin": set(PAGES),
}


def test_anonymous_visitors_are_sent_to_the_login_page(client, world):
    for url in ["/console/", *PAGES]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/console/login/"), url
    assert client.get("/console/login/").status_code == 200
    assert client.get("/console/api/queue/").status_code == 401


@pytest.mark.parametrize("who", ["member_a", "finance", "admin"])
def test_each_role_opens_its_pages_only(request, who):
    persona = request.getfixturevalue(who)
    allowed = ALLOWED[persona.user.role]
    for url in PAGES:
        status = persona.client.get(url).status_code
        assert status == (200 if url in allowed else 403), (who, url, status)


def test_console_entry_redirects_by_role(member_a, finance, admin):
    assert member_a.client.get("/console/")["Location"] == "/console/queue/"
    assert finance.client.get("/console/")["Location"] == "/console/finance/"
    assert admin.client.get("/console/")["Location"] == "/console/ops/"


def test_login_with_a_password_lands_on_the_console(client, member_a):
    response = client.post("/console/login/", {"username": "ann", "password": "pw-ann", "next": "/console/"})
    assert response.status_code == 302 and response["Location"] == "/console/"


def test_queue_page_shows_own_tenant_only(member_a, teammate_a, member_b):
    page_a = member_a.client.get("/console/queue/").content.decode()
    page_b = member_b.client.get("/console/queue/").content.decode()
    assert A_REQUEST in page_a and B_REQUEST not in page_a
    assert B_REQUEST in page_b and A_REQUEST not in page_b
    assert A_REQUEST in teammate_a.client.get("/console/queue/").content.decode()  # a teammate shares the tenant


def test_a_member_cannot_pick_another_tenant(member_b):
    page = member_b.client.get("/console/queue/?tenant=support").content.decode()
    assert A_REQUEST not in page and "sales" in page


def test_an_admin_may_watch_any_tenant(admin):
    assert A_REQUEST in admin.client.get("/console/queue/?tenant=support").content.decode()


def test_request_api_answers_own_requests_and_404_for_others(member_a, member_b):
    own = member_a.client.get(f"/console/api/request/{A_REQUEST}/")
    assert own.status_code == 200 and own.json()["charge"]["amount"]
    assert member_b.client.get(f"/console/api/request/{A_REQUEST}/").status_code == 404
    assert member_b.client.get(f"/console/api/request/{A_REQUEST}/?tenant=support").status_code == 404


def test_queue_api_names_own_tenant_even_when_asked_for_another(member_b):
    body = member_b.client.get("/console/api/queue/?tenant=support").json()
    assert body["tenant"] == "sales"


def test_queue_api_pages_are_bounded_and_the_waits_are_the_callers(member_b):
    body = member_b.client.get("/console/api/queue/?offset=0&limit=10").json()
    assert body["jobs"] == [] and (body["offset"], body["limit"]) == (0, 10)
    assert member_b.client.get("/console/api/queue/?limit=0").status_code == 400
    assert member_b.client.get("/console/api/queue/?limit=501").status_code == 400
    assert member_b.client.get("/console/api/queue/?offset=-1").status_code == 400
    assert member_b.client.get("/console/api/waits/?tenant=support").json()["tenant"] == "sales"


@pytest.mark.parametrize("report", ["charges", "burn", "burn-series", "class-mix", "class-shift", "ledger", "alerts"])
def test_billing_reports_do_not_leak_across_tenants(member_b, finance, report):
    rows_b = member_b.client.get(f"/api/billing/{report}/", HTTP_ACCEPT="application/json").json()["rows"]
    assert all(row.get("tenant") in (None, "sales") for row in rows_b)
    assert A_REQUEST not in str(rows_b)
    assert member_b.client.get(f"/api/billing/{report}/?tenant=support").status_code == 404
    rows_all = finance.client.get(f"/api/billing/{report}/?tenant=support", HTTP_ACCEPT="application/json")
    assert rows_all.status_code in (200, 400)  # finance may ask for any tenant (what-if needs more params)


def test_key_created_shows_the_secret_once_and_lists_the_prefix(member_a):
    response = member_a.client.post("/console/keys/create/", {"label": "ci", "default_class": "NEAR_RT"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    key = ApiKey.objects.get(label="ci")
    secret = response.context["secret"]
    assert key.prefix in secret and secret in response.content.decode()
    page = member_a.client.get("/console/queue/").content.decode()
    assert key.prefix in page and secret not in page
    assert key.tenant.slug == "support"
    row = page[page.index(f"<code>{key.prefix}</code>") :].split("</tr>")[0]
    assert f">{member_a.user.username}<" in row  # who created it, as the ledger records it


def test_key_class_must_be_allowed_to_the_tenant(world):
    from tests.integration.console.conftest import persona

    finance_member = persona("fin", role="member", tenant=world["finance"])  # may declare NEAR_RT, BATCH, RETRY
    response = finance_member.client.post("/console/keys/create/", {"default_class": "INTERACTIVE"}, follow=True)
    assert "not one your tenant may use" in response.content.decode()
    assert not ApiKey.objects.filter(tenant=world["finance"]).exists()


def test_revoke_own_key_but_not_another_tenants(member_a, member_b):
    member_a.client.post("/console/keys/create/", {"label": "a-key", "default_class": "BATCH"})
    key = ApiKey.objects.get(label="a-key")
    assert member_b.client.post(f"/console/keys/{key.prefix}/revoke/").status_code == 404
    key.refresh_from_db()
    assert key.is_active
    assert member_a.client.post(f"/console/keys/{key.prefix}/revoke/", {"confirm": "yes"}).status_code == 302
    key.refresh_from_db()
    assert not key.is_active


def test_forms_need_csrf(world):
    from django.test import Client

    from tests.integration.console.conftest import persona

    user = persona("csrf", role="member", tenant=world["support"]).user
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/console/keys/create/", {"default_class": "BATCH"}).status_code == 403


def test_finance_page_lists_visible_tenants(finance, admin):
    assert "support" in finance.client.get("/console/finance/").content.decode()
    assert b"chart.umd.js" in admin.client.get("/console/finance/").content


def test_an_admin_picks_a_tenants_queue_and_a_refusal_is_a_styled_page(admin, member_a, world):
    picker = admin.client.get("/console/queue/")
    assert picker.status_code == 200 and b"Whose queue?" in picker.content
    assert all(f"?tenant={slug}".encode() in picker.content for slug in world)
    assert admin.client.get(f"/console/queue/?tenant={A}").status_code == 200
    missing = admin.client.get("/console/queue/?tenant=nope")
    assert missing.status_code == 404 and b"pick one on My queue" in missing.content
    refused = member_a.client.get("/console/ops/")
    assert refused.status_code == 403
    body = refused.content.decode()
    assert "This page is not for your role" in body and 'href="/console/"' in body and "console.css" in body


def test_undelivered_alerts_are_listed_for_admins(world, admin, member_a):
    from billing.alerts import MAX_DELIVERY_ATTEMPTS
    from billing.models import Budget, BudgetAlert

    budget = Budget.objects.filter(tenant=world[A]).first()
    BudgetAlert.objects.create(
        budget=budget,
        threshold_pct=80,
        spent=1,
        limit=1,
        delivery_attempts=MAX_DELIVERY_ATTEMPTS,
        delivery_error="webhook: 500 from hooks.example",
    )
    page = admin.client.get("/console/ops/").content.decode()
    assert 'id="failed-alerts"' in page and "webhook: 500 from hooks.example" in page
    assert member_a.client.get("/console/ops/").status_code == 403
