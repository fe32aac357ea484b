"""Company sign-in without a browser: the rules (YAML, command, console page, audit), the mapping
of claims to a tenant and role, the backend's refusals, and the switch that turns passwords off.
The flow against a real provider is tests/live/console/test_live_signin.py."""

from __future__ import annotations

import io

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, RequestFactory, override_settings

from audit.models import AuditLog
from tenants.models import SignInRule, User
from tenants.oidc import REFUSED_SESSION_KEY, Backend
from tenants.signin import SignInRuleError, mapped, rules_dump, rules_load, username_for
from tests.integration.console.conftest import A, B

RULES = f"""signin:
  rules:
    - {{value: llm-{A}, tenant: {A}, role: member}}
    - {{value: llm-finance, tenant: null, role: finance}}
    - {{value: llm-everyone, tenant: {B}, role: member}}
"""


@pytest.fixture
def rules(world, tmp_path):
    path = tmp_path / "signin.yaml"
    path.write_text(RULES)
    rules_load(path)
    return path


def test_the_first_rule_whose_value_the_claim_holds_decides(rules):
    found = mapped({"groups": ["llm-everyone", f"llm-{A}"]}, "groups")
    assert found is not None and found.tenant.slug == A and found.role == "member"
    finance = mapped({"groups": "llm-finance"}, "groups")  # a single string is one value
    assert finance is not None and finance.tenant is None and finance.role == "finance"
    assert mapped({"groups": ["staff"]}, "groups") is None
    assert mapped({"roles": [f"llm-{A}"]}, "groups") is None  # only the configured claim counts


def test_a_rule_of_an_inactive_tenant_maps_nobody(rules, world):
    world[A].active = False
    world[A].save()
    found = mapped({"groups": [f"llm-{A}", "llm-everyone"]}, "groups")
    assert found is not None and found.tenant.slug == B


def test_dump_and_load_round_trip(rules, tmp_path):
    dumped = rules_dump()
    again = tmp_path / "again.yaml"
    again.write_text(dumped)
    assert rules_load(again) == 3
    assert rules_dump() == dumped
    assert [r.claim_value for r in SignInRule.objects.all()] == [f"llm-{A}", "llm-finance", "llm-everyone"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("rules: []\n", "top-level `signin:`"),
        ("signin:\n  rules:\n    - {value: g, role: member}\n", "a member rule names its tenant"),
        ("signin:\n  rules:\n    - {value: g, tenant: nowhere, role: member}\n", "no tenant 'nowhere'"),
        ("signin:\n  rules:\n    - {value: g, tenant: null, role: boss}\n", "`role` must be one of"),
        ("signin:\n  rules:\n    - {value: '', tenant: null, role: admin}\n", "`value` must be"),
        ("signin:\n  rules:\n    - {value: g, role: admin, extra: 1}\n", "give `value`, `tenant` and `role` only"),
        ("signin:\n  rules:\n    - {value: g, role: admin}\n    - {value: g, role: finance}\n", "one rule only"),
        ("signin: [\n", "signin.yaml"),
    ],
)
def test_a_bad_rules_file_changes_nothing(rules, tmp_path, text, message):
    bad = tmp_path / "signin.yaml"
    bad.write_text(text)
    before = rules_dump()
    with pytest.raises(SignInRuleError, match=message.replace("(", r"\(").replace("[", r"\[")):
        rules_load(bad)
    assert rules_dump() == before


def test_the_command_loads_audits_and_refuses_with_one_line(world, tmp_path):
    path = tmp_path / "signin.yaml"
    path.write_text(RULES)
    out = io.StringIO()
    call_command("signin", "load", str(path), stdout=out)
    assert "loaded 3 sign-in rules" in out.getvalue()
    entry = AuditLog.objects.get(entity="signin_rule", action="load")
    assert entry.actor == "cli" and len(entry.new) == 3 and entry.old == []
    path.write_text("signin:\n  rules:\n    - {value: g, role: member}\n")
    with pytest.raises(CommandError) as refused:
        call_command("signin", "load", str(path))
    assert refused.value.returncode == 2 and "names its tenant" in str(refused.value)
    dumped = io.StringIO()
    call_command("signin", "dump", stdout=dumped)
    assert dumped.getvalue() == rules_dump()


def _signed_in(claims: dict):
    """The backend's answer for a provider that vouches for ``claims``, and the session it wrote."""
    request = RequestFactory().get("/console/sso/callback/")
    request.session = SessionStore()
    backend = Backend()
    backend.request = request
    backend.get_userinfo = lambda access_token, id_token, payload: claims  # type: ignore[method-assign]
    return backend.get_or_create_user("access", "id", {"sub": claims["sub"]}), request.session


def test_a_mapped_user_is_made_and_follows_the_rules_at_each_sign_in(rules, world):
    User.objects.create_user(username="ann", password="local-pw", role="admin")  # a local login of that name
    user, _ = _signed_in({"sub": "ann", "email": "ann@example.com", "groups": [f"llm-{A}"]})
    assert user.username == "sso-ann" and user.role == "member" and user.tenant.slug == A
    assert not user.has_usable_password()
    assert User.objects.get(username="ann").role == "admin"  # the provider never takes it over
    again, _ = _signed_in({"sub": "ann", "email": "ann@example.com", "groups": ["llm-finance"]})
    assert again.pk == user.pk and again.role == "finance" and again.tenant is None


def test_unmapped_and_deactivated_users_are_refused_and_told_why(rules, world):
    user, session = _signed_in({"sub": "zed", "email": "zed@example.com", "groups": ["staff"]})
    assert user is None
    assert session[REFUSED_SESSION_KEY] == {"reason": "unmapped", "who": "zed@example.com", "values": ["staff"]}
    member, _ = _signed_in({"sub": "kim", "groups": [f"llm-{A}"]})
    member.is_active = False
    member.save()
    user, session = _signed_in({"sub": "kim", "groups": [f"llm-{A}"]})
    assert user is None and session[REFUSED_SESSION_KEY]["reason"] == "deactivated"


def test_long_subjects_get_a_bounded_username():
    name = username_for("x" * 400)
    assert name.startswith("sso-") and len(name) <= 150
    assert username_for("x" * 400) == name != username_for("y" * 400)


def test_the_refusal_page_names_whom_to_ask(world):
    client = Client()
    session = client.session
    session[REFUSED_SESSION_KEY] = {"reason": "unmapped", "who": "zed@example.com", "values": ["staff", "ops"]}
    session.save()
    with override_settings(FAIRGATE_SIGNIN_CONTACT="the platform team"):
        page = client.get("/console/sso/refused/")
    assert page.status_code == 403
    text = page.content.decode()
    assert "staff, ops" in text and "Ask the platform team" in text


def test_password_logins_can_be_switched_off(world):
    User.objects.create_user(username="lou", password="lou-password-1", role="finance")
    with override_settings(FAIRGATE_LOCAL_LOGIN=False, FAIRGATE_OIDC_ISSUER="http://idp.invalid"):
        page = Client().get("/console/login/")
        assert 'name="password"' not in page.content.decode() and 'id="sso-login"' in page.content.decode()
        posted = Client().post("/console/login/", {"username": "lou", "password": "lou-password-1"})
        assert posted.status_code == 403
    page = Client().get("/console/login/")
    assert 'name="password"' in page.content.decode() and 'id="sso-login"' not in page.content.decode()


def test_admins_edit_the_rules_in_the_console(admin, member_a, world):
    assert member_a.client.get("/console/signin/rules/").status_code == 403
    added = admin.client.post("/console/signin/rules/add/", {"value": "llm-sales", "tenant": B, "role": "member"})
    assert added.status_code == 302
    rule = SignInRule.objects.get(claim_value="llm-sales")
    assert rule.tenant.slug == B and rule.role == "member"
    assert AuditLog.objects.filter(entity="signin_rule", action="create", key="llm-sales").exists()
    page = admin.client.get("/console/signin/rules/", follow=True).content.decode()
    assert "llm-sales" in page
    refused = admin.client.post("/console/signin/rules/add/", {"value": "llm-x", "tenant": "", "role": "member"})
    assert "names its tenant" in admin.client.get(refused.url).content.decode()
    assert not SignInRule.objects.filter(claim_value="llm-x").exists()
    admin.client.post(f"/console/signin/rules/{rule.pk}/delete/")
    assert not SignInRule.objects.filter(pk=rule.pk).exists()
    assert AuditLog.objects.filter(entity="signin_rule", action="delete", key="llm-sales").exists()
