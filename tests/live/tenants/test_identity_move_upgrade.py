"""A database made by the code before identity moved to the tenants app, with rows in every
table, upgraded by today's ``manage.py migrate``: nothing renamed, nothing lost, and users,
permissions, API keys and the ledger still point where they did.

The previous code is the repository itself at ``BEFORE`` (``git archive``), run as its own
processes on a scratch database (SQLite here, PostgreSQL when DATABASE_URL is on PostgreSQL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.launch import postgres_create, postgres_drop

REPO = Path(__file__).resolve().parents[3]
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


def _tables_and_rows(run, env) -> dict[str, int]:
    script = (
        "import json; from django.db import connection; "
        "c = connection.cursor(); names = connection.introspection.table_names(c); "
        "print('ROWS=' + json.dumps({n: c.execute(f'SELECT COUNT(*) FROM \"{n}\"').fetchone()[0] for n in names}))"
    )
    return json.loads(_marked(run(["shell", "-c", script], env), "ROWS="))


def _marked(output: str, marker: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(marker)).removeprefix(marker)


@pytest.fixture
def scratch_database(tmp_path):
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        made = postgres_create(url.rsplit("/", 1)[0], f"fg_upgrade_{os.getpid()}")
        yield made
        postgres_drop(made, attempts=3)
    else:
        yield f"sqlite:///{tmp_path / 'upgrade.sqlite3'}"


def test_a_database_made_before_the_move_upgrades_with_every_row_and_reference_kept(tmp_path, scratch_database):
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (git archive of the previous code)")
    old = tmp_path / "before"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")},
        "DATABASE_URL": scratch_database,
        "SECRET_KEY": "upgrade-test-only",
        "FAIRGATE_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }

    def run_in(where: Path):
        def run(args: list[str], env_: dict) -> str:
            done = subprocess.run(
                [sys.executable, "manage.py", *args], cwd=where, env=env_, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"manage.py {args[0]} in {where.name} failed:\n{done.stdout}\n{done.stderr}"
            return done.stdout

        return run

    before, today = run_in(old), run_in(REPO)
    before(["migrate", "--no-input"], env)
    secret = _marked(before(["shell", "-c", MAKE_ROWS], env), "SECRET=")
    rows_before = _tables_and_rows(before, env)
    empty = sorted(t for t, n in rows_before.items() if n == 0)
    assert empty == [], f"the previous code's database should have rows in every table: {empty}"

    upgraded = today(["migrate", "--no-input"], env)
    assert "Adopted a database made before tenants" in upgraded
    rows_after = _tables_and_rows(today, env)
    made = set(rows_after) - set(rows_before)
    assert set(rows_before) <= set(rows_after)  # no table renamed or dropped
    assert all(t.startswith(NEWER_APPS) and rows_after[t] == 0 for t in made), made  # made: only later apps'
    newer = json.loads(_marked(today(["shell", "-c", NEWER_ROWS], env), "NEWER="))  # the later apps' own rows
    changed = {
        t: (rows_before[t], rows_after[t] - newer.get(t, 0))
        for t in rows_before
        if rows_before[t] != rows_after[t] - newer.get(t, 0)
    }
    assert set(changed) == {"django_migrations"}, changed  # no row lost or added (no duplicate content type)
    assert "[X] 0003_identity_to_tenants" in today(["showmigrations", "gateway"], env)

    found = json.loads(_marked(today(["shell", "-c", CHECK], env), "RESULT="))
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
