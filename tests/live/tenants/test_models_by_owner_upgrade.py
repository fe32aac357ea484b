"""A database made by the code before the audit log moved to its own app and the price versions to
billing, with rows in both tables, upgraded by today's ``manage.py migrate``: nothing renamed,
nothing lost, and the rows (with the ledger's references, permissions and admin history) are read
and written through the new models.

The previous code is the repository itself at ``BEFORE`` (``git archive``), run as its own
processes on a scratch database (SQLite here, PostgreSQL when DATABASE_URL is on PostgreSQL).
"""

from __future__ import annotations

import json

import pytest

from tenants.keys import key_matches
from tests.live.tenants.upgrading import (
    REPO,
    checkout,
    manage_in,
    marked,
    scratch_env,
    tables_and_rows,
    without_later,
)

BEFORE = "9f12e6841e4cbb964271a8f86d89bdf65de9e4ab"  # the last commit with AuditLog and PriceVersion in scheduling
PASSWORD = "upgrade-pass-2"
MOVED = {"scheduling_auditlog", "scheduling_priceversion"}

# Run by the previous code: configuration (classes, price versions, audit rows), a price change,
# a key, a ledger entry priced by a version, a user with the moved models' permissions, admin history.
MAKE_ROWS = f"""
import json
from decimal import Decimal
from django.contrib.admin.models import LogEntry, CHANGE
from django.contrib.auth.models import Permission
from django.core.management import call_command
from billing.models import LedgerEntry
from billing.services import budget_hold, charge_settle
from gateway.services import apikey_create
from scheduling.models import AuditLog, PriceVersion, PriorityClass
from scheduling.services import price_set
from tenants.models import Tenant, User

call_command("scheduler_config", "load", "config/scheduler.example.yaml", actor="upgrade-test")
batch = price_set(priority_class=PriorityClass.objects.get(name="BATCH"), price_factor=Decimal("0.65"), actor="cfo")
key, secret = apikey_create(tenant_slug="sales", default_class="BATCH", label="kept", actor="upgrade-test")
budget_hold(tenant_slug="sales", request_id="sales/r1", class_name="BATCH", model="sim-llama",
            prompt_tokens=10, max_output_tokens=10)
charge_settle(request_id="sales/r1", backend_name="sim-gpu", prompt_tokens=10, completion_tokens=5)
user = User.objects.create_user("bea", "bea@example.invalid", "{PASSWORD}", tenant=Tenant.objects.get(slug="sales"))
user.user_permissions.add(*Permission.objects.filter(codename__in=["view_auditlog", "view_priceversion"]))
LogEntry.objects.log_actions(user.pk, [batch], CHANGE, change_message="price made before the move")
LogEntry.objects.log_actions(user.pk, [AuditLog.objects.first()], CHANGE, change_message="audit made before the move")
print("SECRET=" + secret)
priced = LedgerEntry.objects.exclude(price_version=None)
print("BEFORE=" + json.dumps({{
    "audit": list(AuditLog.objects.order_by("pk").values_list("pk", "actor", "action", "entity", "key", "field")),
    "prices": sorted([v.pk, v.priority_class.name, str(v.price_factor)] for v in PriceVersion.objects.all()),
    "ledger_versions": sorted(priced.values_list("price_version_id", flat=True)),
}}))
"""

# Run by today's code on the upgraded database: the same rows through the new models, then new ones.
CHECK = f"""
import json
from decimal import Decimal
from django.contrib.admin.models import LogEntry
from django.contrib.auth import authenticate
from django.contrib.contenttypes.models import ContentType
from audit.models import AuditLog
from audit.services import audit_record
from billing.models import LedgerEntry, PriceVersion
from billing.price_versions import factor_in_force, price_set
from django.utils import timezone
from scheduling.models import PriorityClass
from scheduling.selectors import class_names_active, config_live
from tenants.services import apikey_create

def versions(rows):
    return [[v.pk, v.priority_class.name, str(v.price_factor)] for v in rows]

batch = PriorityClass.objects.get(name="BATCH")
kept = {{
    "audit": list(AuditLog.objects.order_by("pk").values_list("pk", "actor", "action", "entity", "key", "field")),
    "prices": sorted(versions(batch.prices.all()) + versions(PriceVersion.objects.exclude(priority_class=batch))),
    "ledger_versions": sorted(e.price_version.pk for e in LedgerEntry.objects.exclude(price_version=None)),
}}
last_pk = AuditLog.objects.order_by("-pk").values_list("pk", flat=True).first()
user = authenticate(username="bea", password="{PASSWORD}")
history = {{e.change_message: e.content_type.model_class().__module__ + "." + e.content_type.model_class().__name__
           for e in LogEntry.objects.filter(change_message__endswith="made before the move")}}
batch_before = str(factor_in_force(class_name="BATCH", at=timezone.now()))
price_set(priority_class=batch, price_factor=Decimal("0.6"), actor="cfo")
audit_record(actor="upgrade-test", action="update", entity="check", key="after")
_key, secret = apikey_create(tenant_slug="sales", default_class="BATCH", label="after", actor="upgrade-test",
                             known_classes=class_names_active())
print("RESULT=" + json.dumps({{
    "kept": kept,
    "perms": sorted(p for p in user.get_all_permissions() if p.endswith(("_auditlog", "_priceversion"))),
    "moved_types": sorted(
        ContentType.objects.filter(model__in=["auditlog", "priceversion"]).values_list("app_label", "model")
    ),
    "history": history,
    "batch_before": batch_before,
    "batch_after": str(next(c.price_factor for c in config_live().classes if c.name == "BATCH")),
    "new_audit": sorted(AuditLog.objects.filter(pk__gt=last_pk).values_list("entity", flat=True)),
    "tables": sorted({{AuditLog._meta.db_table, PriceVersion._meta.db_table}}),
}}))
"""


def test_a_database_made_before_the_audit_and_price_moves_upgrades_with_its_rows_usable(tmp_path, scratch_database):
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (git archive of the previous code)")
    old = checkout(BEFORE, tmp_path / "before")
    env = scratch_env(scratch_database, tmp_path)
    before, today = manage_in(old), manage_in(REPO)
    before(["migrate", "--no-input"], env)
    made = before(["shell", "-c", MAKE_ROWS], env)
    secret, rows = marked(made, "SECRET="), json.loads(marked(made, "BEFORE="))
    assert len(rows["audit"]) > 1 and len(rows["prices"]) > 1 and rows["ledger_versions"]
    counts_before = tables_and_rows(before, env)
    assert all(counts_before[t] > 0 for t in MOVED)

    upgraded = today(["migrate", "--no-input"], env)
    for applied in ("audit.0001_initial", "scheduling.0005", "billing.0006", "scheduling.0006"):
        assert f"Applying {applied}" in upgraded
    counts_after = without_later(today, env, tables_and_rows(today, env))
    assert set(counts_after) == set(counts_before)  # no table made, renamed or dropped
    changed = {t: (counts_before[t], counts_after[t]) for t in counts_before if counts_before[t] != counts_after[t]}
    assert set(changed) == {"django_migrations"}, changed  # no row lost or added (no duplicate content type)

    found = json.loads(marked(today(["shell", "-c", CHECK], env), "RESULT="))
    assert found["kept"] == rows  # every row, read through the new models (the ledger's references too)
    assert found["perms"] == ["audit.view_auditlog", "billing.view_priceversion"]
    assert found["moved_types"] == [["audit", "auditlog"], ["billing", "priceversion"]]
    assert found["history"] == {
        "price made before the move": "billing.models.PriceVersion",
        "audit made before the move": "audit.models.AuditLog",
    }
    assert found["batch_before"] == "0.6500" and found["batch_after"] == "0.6"  # written through the new model
    assert found["new_audit"] == ["apikey", "check", "class"]  # written by tenants, audit and billing
    assert found["tables"] == sorted(MOVED)
    assert key_matches(secret, _key_hash(today, env))  # the key issued before the move still authenticates
    today(["makemigrations", "--check", "--dry-run"], env)  # the models match the migrated state

    again = today(["migrate", "--no-input"], env)  # nothing more to apply
    assert "No migrations to apply" in again


def _key_hash(today, env) -> str:
    script = "from tenants.models import ApiKey; print('HASH=' + ApiKey.objects.get(label='kept').secret_hash)"
    return marked(today(["shell", "-c", script], env), "HASH=")
