"""A ledger written before entries recorded who spent, upgraded by today's ``manage.py migrate``:
its rows read with an empty key, job and creator (the columns' default: no row rewritten), the
ledger stays append-only, and new bookings record them.

The previous code is the repository at ``BEFORE`` (``git archive``), run as its own processes on a
scratch database (SQLite here, PostgreSQL when DATABASE_URL is on PostgreSQL).
"""

from __future__ import annotations

import json

import pytest

from tests.live.tenants.upgrading import REPO, checkout, manage_in, marked, scratch_env

BEFORE = "fd555f92e1cb88d4476a3d5142d4b0a34dc82583"  # the last commit without the ledger's spender columns

MAKE_ROWS = """
import json
from django.core.management import call_command
from billing.models import LedgerEntry
from billing.services import budget_hold, charge_settle
from scheduling.selectors import class_names_active
from tenants.services import apikey_create

call_command("scheduler_config", "load", "config/scheduler.example.yaml", actor="upgrade-test")
apikey_create(tenant_slug="sales", default_class="BATCH", label="old", actor="console:olga",
              known_classes=class_names_active())
budget_hold(tenant_slug="sales", request_id="sales/r1", class_name="BATCH", model="sim-llama",
            prompt_tokens=10, max_output_tokens=10)
charge_settle(request_id="sales/r1", backend_name="sim-gpu", prompt_tokens=10, completion_tokens=5)
print("BEFORE=" + json.dumps(sorted([e.kind, str(e.amount)] for e in LedgerEntry.objects.all())))
"""

CHECK = """
import json
from django.db import DatabaseError, connection, transaction
from billing.models import LedgerEntry
from billing.reports import spend_by
from billing.services import budget_hold, charge_settle
from tenants.models import ApiKey, Tenant

old = sorted([e.kind, str(e.amount), e.key_prefix, e.job_id, e.key_creator] for e in LedgerEntry.objects.all())
refused = False
try:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE billing_ledgerentry SET job_id = 'x'")
except DatabaseError:
    refused = True
budget_hold(tenant_slug="sales", request_id="sales/r2", class_name="BATCH", model="sim-llama",
            prompt_tokens=10, max_output_tokens=10, key_prefix="fg1new", job_id="j-after", key_creator="nina")
charge_settle(request_id="sales/r2", backend_name="sim-gpu", prompt_tokens=10, completion_tokens=5)
new = sorted([e.kind, e.key_prefix, e.job_id, e.key_creator] for e in LedgerEntry.objects.filter(request_id="sales/r2"))
report = spend_by(tenants=Tenant.objects.filter(slug="sales"), group_by="job")
print("RESULT=" + json.dumps({
    "old": old,
    "refused": refused,
    "new": new,
    "jobs": sorted([r["job"], r["requests"]] for r in report),
    "creators": sorted(ApiKey.objects.values_list("created_by", flat=True)),
}))
"""


def test_a_ledger_from_before_the_spender_columns_upgrades_with_its_rows_readable(tmp_path, scratch_database):
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (git archive of the previous code)")
    old = checkout(BEFORE, tmp_path / "before")
    env = scratch_env(scratch_database, tmp_path)
    before, today = manage_in(old), manage_in(REPO)
    before(["migrate", "--no-input"], env)
    rows = json.loads(marked(before(["shell", "-c", MAKE_ROWS], env), "BEFORE="))
    assert sorted(kind for kind, _ in rows) == ["charge", "hold", "release"]

    upgraded = today(["migrate", "--no-input"], env)
    assert "Applying billing.0010_ledger_spender" in upgraded and "Applying tenants.0005_apikey_created_by" in upgraded
    found = json.loads(marked(today(["shell", "-c", CHECK], env), "RESULT="))
    assert found["old"] == sorted([kind, amount, "", "", ""] for kind, amount in rows)  # every old row, empty
    assert found["refused"] is True  # still append-only (SQLite rebuilt the table: its triggers are back)
    assert found["new"] == [[kind, "fg1new", "j-after", "nina"] for kind in ("charge", "hold", "release")]
    assert found["jobs"] == [["", 1], ["j-after", 1]]
    assert found["creators"] == [""]  # a key made before: no creator recorded
    today(["makemigrations", "--check", "--dry-run"], env)
