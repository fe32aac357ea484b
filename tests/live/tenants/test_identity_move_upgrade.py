"""A database made by the code before identity moved to the tenants app, with rows in every
table, upgraded by today's ``manage.py migrate``: nothing renamed, nothing lost, and users,
permissions, API keys and the ledger still point where they did.

The previous code is the repository itself at ``BEFORE`` (``git archive``), run as its own
processes on a scratch database (SQLite here, PostgreSQL when DATABASE_URL is on PostgreSQL).
"""

from __future__ import annotations

import json

import pytest

from tests.live.tenants.upgrading import REPO, checkout, manage_in, marked, scratch_env, tables_and_rows, without_later

BEFORE = "d520383193656ba32ef8ffa84248b70bf9d5a27a"  # the last commit with Tenant, User and ApiKey in gateway/models.py
PASSWORD = "upgrade-pass-1"
NEWER_LABELS = ["batches"]  # apps added after BEFORE: the upgrade's migrate makes their (empty) tables
NEWER_APPS = tuple(f"{label}_" for label in NEWER_LABELS)
NEWER_ROWS = """
import json
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
labels = LABELS
print("NEWER=" + json.dumps({
    "django_content_type": ContentType.objects.filter(app_label__in=labels).count(),
    "auth_permission": Permission.objects.filter(content_type__app_label__in=labels).count(),
}))
""".replace("LABELS", repr(NEWER_LABELS))

# Run by the previous code: rows in every table, through its own services where it has them.
MAKE_ROWS = f"""
from datetime import timedelta
from django.contrib.admin.models import LogEntry, ADDITION
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.utils import timezone
from billing.models import Budget, BudgetAlert, GatewayProcess, TenantBilling
from billing.services import budget_hold, charge_settle
from gateway.models import ApiKey, DowngradeEvent, Tenant, User
from gateway.services import apikey_create

call_command("scheduler_config", "load", "config/scheduler.example.yaml", actor="upgrade-test")
tenant = Tenant.objects.get(slug="sales")
user = User.objects.create_user("ann", "ann@example.invalid", "{PASSWORD}", tenant=tenant, role="member")
group = Group.objects.create(name="viewers")
group.permissions.add(Permission.objects.get(codename="view_tenant"))
user.groups.add(group)
user.user_permissions.add(Permission.objects.get(codename="view_apikey"))
key, secret = apikey_create(tenant_slug="sales", default_class="INTERACTIVE", label="kept", actor="upgrade-test")
TenantBilling.objects.get_or_create(tenant=tenant, defaults={{"webhook_url": "https://example.invalid/hook"}})
budget_hold(tenant_slug="sales", request_id="sales/r1", class_name="INTERACTIVE", model="sim-llama",
            prompt_tokens=10, max_output_tokens=10)
charge_settle(request_id="sales/r1", backend_name="sim-gpu", prompt_tokens=10, completion_tokens=5)
budget_hold(tenant_slug="sales", request_id="sales/r2", class_name="BATCH", model="sim-llama",
            prompt_tokens=10, max_output_tokens=10)
budget = Budget.objects.filter(tenant=tenant).first()
BudgetAlert.objects.create(budget=budget, threshold_pct=80, spent=1, limit=2)
now = timezone.now()
GatewayProcess.objects.create(owner="old:1:x", host="old", pid=1, started_at=now, beat_at=now)
DowngradeEvent.objects.create(tenant=tenant, request_id="r3", from_class="INTERACTIVE", to_class="BATCH",
                              rule="undeclared", at=now)
LogEntry.objects.log_actions(user.pk, [tenant], ADDITION, change_message="made before the move")
session = SessionStore()
session["_auth_user_id"] = str(user.pk)
session.set_expiry(timedelta(days=1))
session.create()
print("SECRET=" + secret)
"""

# Run by today's code on the upgraded database.
CHECK = f"""
import json
from django.contrib.admin.models import LogEntry
from django.contrib.auth import authenticate
from django.contrib.contenttypes.models import ContentType
from billing.models import LedgerEntry
from gateway.models import DowngradeEvent
from tenants.models import ApiKey
user = authenticate(username="ann", password="{PASSWORD}")
entry = LogEntry.objects.get(change_message="made before the move")
print("RESULT=" + json.dumps({{
    "user": user is not None and user.tenant.slug,
    "perms": sorted(p for p in user.get_all_permissions() if p.endswith(("_tenant", "_apikey"))),
    "moved_types": sorted(
        ContentType.objects.filter(model__in=["tenant", "user", "apikey"]).values_list("app_label", flat=True)
    ),
    "log_entry_model": entry.content_type.model_class().__module__ + "." + entry.content_type.model_class().__name__,
    "ledger_tenants": sorted({{e.tenant.slug for e in LedgerEntry.objects.all()}}),
    "downgrade_tenant": DowngradeEvent.objects.get().tenant.slug,
    "keys": {{k.label: k.secret_hash for k in ApiKey.objects.all()}},
}}))
"""


def test_a_database_made_before_the_move_upgrades_with_every_row_and_reference_kept(tmp_path, scratch_database):
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (git archive of the previous code)")
    old = checkout(BEFORE, tmp_path / "before")
    env = scratch_env(scratch_database, tmp_path)
    before, today = manage_in(old), manage_in(REPO)
    before(["migrate", "--no-input"], env)
    secret = marked(before(["shell", "-c", MAKE_ROWS], env), "SECRET=")
    rows_before = tables_and_rows(before, env)
    empty = sorted(t for t, n in rows_before.items() if n == 0)
    assert empty == [], f"the previous code's database should have rows in every table: {empty}"

    upgraded = today(["migrate", "--no-input"], env)
    assert "Adopted a database made before tenants" in upgraded
    rows_after = without_later(today, env, tables_and_rows(today, env))
    made = set(rows_after) - set(rows_before)
    assert set(rows_before) <= set(rows_after)  # no table renamed or dropped
    assert all(t.startswith(NEWER_APPS) and rows_after[t] == 0 for t in made), made  # made: only later apps'
    newer = json.loads(marked(today(["shell", "-c", NEWER_ROWS], env), "NEWER="))  # the later apps' own rows
    changed = {
        t: (rows_before[t], rows_after[t] - newer.get(t, 0))
        for t in rows_before
        if rows_before[t] != rows_after[t] - newer.get(t, 0)
    }
    assert set(changed) == {"django_migrations"}, changed  # no row lost or added (no duplicate content type)
    assert "[X] 0003_identity_to_tenants" in today(["showmigrations", "gateway"], env)

    found = json.loads(marked(today(["shell", "-c", CHECK], env), "RESULT="))
    assert found["user"] == "sales"  # the password and the tenant link survived
    assert found["perms"] == ["tenants.view_apikey", "tenants.view_tenant"]  # by group and directly
    assert found["moved_types"] == ["tenants", "tenants", "tenants"]
    assert found["log_entry_model"] == "tenants.models.Tenant"
    assert found["ledger_tenants"] == ["sales"] and found["downgrade_tenant"] == "sales"
    from tenants.keys import key_matches

    assert key_matches(secret, found["keys"]["kept"])  # the key issued before the move still authenticates
    today(["makemigrations", "--check", "--dry-run"], env)  # the models match the migrated state

    again = today(["migrate", "--no-input"], env)  # idempotent: nothing more to adopt or apply
    assert "Adopted" not in again and "No migrations to apply" in again
