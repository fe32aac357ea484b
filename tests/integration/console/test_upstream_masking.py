"""A backend's credential by name only: `backend create --api-key-env`, the YAML round trip through
the database, and the secret's value in none of the console's backend table, the admin's backend
page or the audit rows (while the variables are set in this process)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from audit.models import AuditLog
from scheduling.config_files import config_dump_text, config_load_file
from scheduling.models import Backend
from scheduling.selectors import config_live
from tenants.models import User

SECRETS = {"FG_T_KEY": "sk-live-never-shown-1", "FG_T_AZ": "az-never-shown-2", "FG_T_TAG": "tag-never-shown-3"}


@pytest.fixture
def keyed(world, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    call_command(
        "backend", "create", "openai-acct", "--url", "https://api.openai.example/v1", "--model", "gpt-x",
        "--slots", "4", "--api-key-env", "FG_T_KEY", "--header", "X-Team=llm", "--header", "X-Tag=env:FG_T_TAG",
    )  # fmt: skip
    call_command(
        "backend", "create", "azure-eu", "--url", "https://eu.openai.azure.example", "--model", "gpt-x",
        "--slots", "2", "--api-key-env", "FG_T_AZ", "--dialect", "azure", "--deployment", "gpt-eu",
        "--api-version", "2024-06-01", "--fallback-for", "openai-acct",
    )  # fmt: skip


def test_backend_create_stores_the_names_only(keyed):
    row = Backend.objects.get(name="azure-eu")
    assert (row.api_key_env, row.dialect, row.deployment, row.api_version) == (
        "FG_T_AZ",
        "azure",
        "gpt-eu",
        "2024-06-01",
    )
    assert Backend.objects.get(name="openai-acct").headers == {"X-Team": "llm", "X-Tag": "env:FG_T_TAG"}


def test_backend_create_refuses_a_literal_credential_header(world):
    with pytest.raises(CommandError, match="looks like a credential"):
        call_command(
            "backend", "create", "leaky", "--url", "http://x/v1", "--model", "m", "--slots", "1",
            "--header", "X-Api-Key=sk-literal",
        )  # fmt: skip
    assert not Backend.objects.filter(name="leaky").exists()


def test_dump_then_load_gives_the_same(keyed, tmp_path):
    before, audits = config_live(), AuditLog.objects.count()
    dumped = tmp_path / "dump.yaml"
    dumped.write_text(config_dump_text())
    assert "api_key_env: FG_T_AZ" in dumped.read_text() and "dialect: azure" in dumped.read_text()
    config_load_file(dumped, actor="test")
    assert config_live() == before and AuditLog.objects.count() == audits


def test_the_secrets_are_shown_nowhere(keyed, admin):
    root = User.objects.create_superuser(username="root", password="pw-root-1", email="root@example.com")
    superuser = Client()
    superuser.force_login(root)
    row = Backend.objects.get(name="openai-acct")
    pages = {
        "console backend table": admin.client.get("/console/policy/"),
        "admin backend page": superuser.get(f"/admin/scheduling/backend/{row.pk}/change/"),
        "admin backend list": superuser.get("/admin/scheduling/backend/"),
    }
    table = pages["console backend table"].content.decode()
    assert "key env:FG_T_KEY" in table and "X-Tag: env:FG_T_TAG" in table and "azure gpt-eu" in table
    audit = str(list(AuditLog.objects.values_list("old", "new")))
    assert "FG_T_KEY" in audit
    for where, text in {**{k: v.content.decode() for k, v in pages.items()}, "audit rows": audit}.items():
        assert all(value not in text for value in SECRETS.values()), where
