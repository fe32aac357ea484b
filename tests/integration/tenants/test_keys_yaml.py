"""API keys in the configuration YAML: the dump lists them without secrets; a load changes the
expiry (and revocation) of existing keys by prefix, audited, refuses unknown prefixes and never
makes a key; a refused file changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from audit.models import AuditLog
from scheduling.config_files import config_dump_text
from scheduling.selectors import class_names_active
from tenants.models import ApiKey
from tenants.services import apikey_create, apikey_rotate

pytestmark = pytest.mark.django_db
EXAMPLE = Path(settings.BASE_DIR) / "config" / "scheduler.example.yaml"


@pytest.fixture
def keys():
    call_command("scheduler_config", "load", str(EXAMPLE))
    make = {"tenant_slug": "sales", "default_class": "BATCH", "known_classes": class_names_active()}
    nightly, nightly_secret = apikey_create(label="nightly", actor="console:carol", **make)
    forever, _ = apikey_create(label="forever", actor="cli", **make)
    soon = timezone.now() + timedelta(days=30)
    expiring, _ = apikey_create(label="expiring", actor="console:dave", expires_at=soon, **make)
    rotated_from = apikey_create(label="rotated", actor="cli", **make)[0]
    apikey_rotate(prefix=rotated_from.prefix, grace=timedelta(hours=24), actor="cli")
    return {"nightly": nightly, "forever": forever, "expiring": expiring, "rotated": rotated_from}, nightly_secret


def dumped(tmp_path) -> tuple[Path, dict]:
    path = tmp_path / "dump.yaml"
    call_command("scheduler_config", "dump", str(path))
    return path, yaml.safe_load(path.read_text())


def load(path) -> None:
    call_command("scheduler_config", "load", str(path))


def by_prefix(document) -> dict[str, dict]:
    return {row["prefix"]: row for row in document["api_keys"]}


def test_the_dump_lists_every_key_without_its_secret(keys, tmp_path):
    made, secret = keys
    path, document = dumped(tmp_path)
    rows = by_prefix(document)
    assert set(rows) == set(ApiKey.objects.values_list("prefix", flat=True))  # the rotation's new key too
    nightly = rows[made["nightly"].prefix]
    assert nightly == {
        "prefix": made["nightly"].prefix,
        "tenant": "sales",
        "label": "nightly",
        "class": "BATCH",
        "created_by": "carol",
        "expires_at": None,
        "revoked": False,
        "state": "active",
    }
    assert rows[made["expiring"].prefix]["expires_at"] == made["expiring"].expires_at.astimezone(UTC).isoformat()
    rotated = ApiKey.objects.get(pk=made["rotated"].pk)
    assert rows[rotated.prefix]["replaced_by"] == rotated.replaced_by.prefix
    assert rows[rotated.prefix]["state"] == "rotated"
    text = path.read_text()
    assert secret not in text and made["nightly"].secret_hash not in text and secret.rsplit("_", 1)[1] not in text


def test_dump_then_load_changes_nothing(keys, tmp_path):
    path, _ = dumped(tmp_path)
    audits = AuditLog.objects.count()
    before = list(ApiKey.objects.order_by("pk").values())
    load(path)
    assert list(ApiKey.objects.order_by("pk").values()) == before
    assert AuditLog.objects.count() == audits
    assert config_dump_text() == path.read_text()


def test_a_changed_expiry_round_trips_and_is_audited(keys, tmp_path, capsys):
    made, _ = keys
    path, document = dumped(tmp_path)
    rows = by_prefix(document)
    new_expiry = (timezone.now() + timedelta(days=90)).replace(microsecond=0).astimezone(UTC)
    rows[made["nightly"].prefix]["expires_at"] = new_expiry.isoformat()
    rows[made["expiring"].prefix]["expires_at"] = None  # never expires now
    rows[made["forever"].prefix]["revoked"] = True
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    load(path)
    assert ApiKey.objects.get(pk=made["nightly"].pk).expires_at == new_expiry
    assert ApiKey.objects.get(pk=made["expiring"].pk).expires_at is None
    assert ApiKey.objects.get(pk=made["forever"].pk).revoked_at is not None
    out = capsys.readouterr().out
    assert f"apikey {made['nightly'].prefix}: expires_at None -> {new_expiry.isoformat()}" in out
    audit = AuditLog.objects.get(entity="apikey", key=made["nightly"].prefix, field="expires_at")
    assert (audit.actor, audit.old, audit.new) == ("cli", None, new_expiry.isoformat())
    assert AuditLog.objects.filter(entity="apikey", key=made["expiring"].prefix, field="expires_at").exists()
    assert AuditLog.objects.filter(entity="apikey", key=made["forever"].prefix, field="revoked_at").exists()
    _, again = dumped(tmp_path)  # and the dump says so
    assert by_prefix(again)[made["nightly"].prefix]["expires_at"] == new_expiry.isoformat()


REFUSALS = [
    (lambda rows, made: rows.append({"prefix": "0123456789", "expires_at": None}), "no API key has this prefix"),
    (lambda rows, made: rows.append({"prefix": 1234567890}), "quoted"),
    (lambda rows, made: rows[0].update(expires_at="2020-01-01T00:00:00+00:00"), "must be in the future"),
    (lambda rows, made: rows[0].update(expires_at="2030-01-01T00:00:00"), "time zone"),
    (lambda rows, made: rows[0].update(tenant="acme"), "cannot move it"),
    (lambda rows, made: rows[0].update(secret="fg_x_y"), "unknown field secret"),
    (lambda rows, made: rows[0].update(replaced_by=rows[1]["prefix"]), "set by a rotation"),
]


@pytest.mark.parametrize("edit, message", REFUSALS)
def test_a_refused_key_entry_names_its_reason_and_changes_nothing(keys, tmp_path, edit, message):
    made, _ = keys
    path, document = dumped(tmp_path)
    edit(document["api_keys"], made)
    document["scheduler"]["classes"][0]["sla_ms"] += 1  # a change that must not be applied either
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    before, audits, count = config_dump_text(), AuditLog.objects.count(), ApiKey.objects.count()
    with pytest.raises(CommandError) as info:
        load(path)
    assert info.value.returncode == 2 and message in str(info.value)
    assert (config_dump_text(), AuditLog.objects.count(), ApiKey.objects.count()) == (before, audits, count)


def test_a_revoked_key_stays_revoked_and_a_file_of_keys_alone_loads(keys, tmp_path):
    made, _ = keys
    prefix = made["forever"].prefix
    alone = tmp_path / "keys.yaml"
    alone.write_text(yaml.safe_dump({"api_keys": [{"prefix": prefix, "revoked": True}]}))
    load(alone)
    assert ApiKey.objects.get(prefix=prefix).revoked_at is not None
    alone.write_text(yaml.safe_dump({"api_keys": [{"prefix": prefix, "revoked": False}]}))
    with pytest.raises(CommandError, match="stays revoked"):
        load(alone)


def test_an_expiry_written_as_a_yaml_timestamp_is_read(keys, tmp_path):
    made, _ = keys
    alone = tmp_path / "keys.yaml"
    alone.write_text(f"api_keys:\n- prefix: '{made['nightly'].prefix}'\n  expires_at: 2031-02-03T04:05:06Z\n")
    load(alone)
    assert ApiKey.objects.get(pk=made["nightly"].pk).expires_at == datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)
