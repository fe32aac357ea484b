"""The scripting commands: tenant, apikey, backend. User errors exit 2 with one clear line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditLog
from scheduling.models import Backend
from tenants.keys import key_matches, key_prefix
from tenants.models import ApiKey, Tenant

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def refused(*args) -> str:
    with pytest.raises(CommandError) as info:
        run(*args)
    assert info.value.returncode == 2
    return str(info.value)


@pytest.fixture
def classes():
    run("scheduler_config", "load", str(Path(settings.BASE_DIR) / "config" / "scheduler.example.yaml"))


def test_tenant_create_list_update(classes):
    run(
        "tenant",
        "create",
        "procure",
        "--name",
        "Legal",
        "--quota-share",
        "0.30",
        "--annual-budget",
        "120000",
        "--classes",
        "INTERACTIVE,BATCH",
        "--vip",
    )
    proc = Tenant.objects.get(slug="procure")
    assert (proc.quota_share, proc.annual_budget, proc.allowed_classes, proc.vip) == (
        Decimal("0.3"),
        Decimal("120000"),
        ["INTERACTIVE", "BATCH"],
        True,
    )
    assert "procure" in run("tenant", "list")
    run("tenant", "update", "procure", "--quota-share", "0.05", "--no-vip")
    proc.refresh_from_db()
    assert (proc.quota_share, proc.vip) == (Decimal("0.05"), False)
    assert AuditLog.objects.filter(entity="tenant", key="procure", field="quota_share").exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (("--quota-share", "0"), "quota share"),
        (("--quota-share", "1.5"), "quota share"),
        (("--quota-share", "0.1", "--classes", "GOLD"), "unknown class GOLD"),
        (("--quota-share", "0.1", "--annual-budget", "-1"), "annual budget"),
    ],
)
def test_tenant_create_refuses_bad_input(classes, args, says):
    assert says in refused("tenant", "create", "x", "--name", "X", *args)
    assert not Tenant.objects.filter(slug="x").exists()


def test_apikey_secret_is_printed_once_and_stored_only_as_hash(classes):
    printed = run("apikey", "create", "finance", "--class", "BATCH", "--label", "nightly")
    assert printed.count("\n") == 1
    full_key = printed.strip()
    key = ApiKey.objects.get(prefix=key_prefix(full_key))
    assert key.default_class == "BATCH" and key.label == "nightly"
    assert full_key.split("_", 2)[2] not in key.secret_hash and full_key != key.secret_hash
    assert key_matches(full_key, key.secret_hash) and not key_matches(full_key + "x", key.secret_hash)
    listing = run("apikey", "list", "finance")
    assert key.prefix in listing and full_key not in listing
    assert key.created_by == "cli" and "created by" in listing  # the command's actor, as the ledger records it
    run("apikey", "revoke", key.prefix)
    key.refresh_from_db()
    assert key.revoked_at is not None and "revoked" in run("apikey", "list")


def test_apikey_errors(classes):
    assert "no active tenant" in refused("apikey", "create", "ghost", "--class", "BATCH")
    assert "unknown class" in refused("apikey", "create", "finance", "--class", "GOLD")
    assert "no API key" in refused("apikey", "revoke", "0000000000")


def test_backend_create_and_list(classes):
    run(
        "backend",
        "create",
        "vllm-a",
        "--url",
        "http://10.0.0.5:8000/v1",
        "--model",
        "llama",
        "--model",
        "qwen",
        "--slots",
        "16",
        "--tpm",
        "200000",
        "--rpm",
        "600",
        "--input-price-per-1k",
        "0.0015",
        "--output-price-per-1k",
        "0.002",
        "--reserved-slots",
        "2",
    )
    run(
        "backend",
        "create",
        "cloud",
        "--url",
        "https://example.invalid/v1",
        "--model",
        "llama",
        "--slots",
        "4",
        "--fallback-for",
        "vllm-a",
    )
    a = Backend.objects.get(name="vllm-a")
    assert (a.model_names, a.slots, a.tpm, a.rpm, a.reserved_slots) == (["llama", "qwen"], 16, 200000, 600, 2)
    assert a.input_price_per_1k == Decimal("0.0015")
    assert Backend.objects.get(name="cloud").fallback_for == a
    assert "vllm-a" in run("backend", "list")
    assert "reserved slots" in refused(
        "backend", "create", "b", "--url", "http://x/v1", "--model", "m", "--slots", "2", "--reserved-slots", "3"
    )
    assert "fallback" in refused(
        "backend", "create", "c", "--url", "http://x/v1", "--model", "m", "--slots", "2", "--fallback-for", "nowhere"
    )


def test_user_error_from_the_shell_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "FAIRGATE_VAR_DIR": str(tmp_path), "DATABASE_URL": ""}
    manage = Path(settings.BASE_DIR) / "manage.py"
    subprocess.run([sys.executable, str(manage), "migrate", "-v0"], env=env, check=True)
    proc = subprocess.run(
        [sys.executable, str(manage), "tenant", "create", "x", "--name", "X", "--quota-share", "2"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "quota share" in proc.stderr
