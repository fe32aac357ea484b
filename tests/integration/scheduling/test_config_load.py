"""scheduler_config load/dump against the database: round trip, idempotence, refusal of bad files."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditLog
from billing.models import PriceVersion
from scheduling.config_files import config_dump_text
from scheduling.models import Backend, DowngradeRule, PriorityClass
from scheduling.selectors import config_live

pytestmark = pytest.mark.django_db
EXAMPLE = Path(settings.BASE_DIR) / "config" / "scheduler.example.yaml"


def load(path) -> None:
    call_command("scheduler_config", "load", str(path))


@pytest.fixture
def loaded():
    load(EXAMPLE)


def test_example_loads_every_section(loaded):
    cfg = config_live()
    assert [c.name for c in cfg.classes] == ["INTERACTIVE", "NEAR_RT", "BATCH", "RETRY"]
    assert cfg.class_named("INTERACTIVE").price_factor == Decimal("1.6")
    assert cfg.class_named("BATCH").sla_ms == 1_800_000
    assert cfg.fairness.mode.value == "weighted_fair_tokens"
    assert [r.name for r in cfg.downgrade_rules]
    assert "BATCH_NET" in cfg.networks
    assert cfg.tenants and cfg.backends


def test_dump_then_load_changes_nothing(loaded, tmp_path):
    before = config_live()
    dumped = tmp_path / "dump.yaml"
    call_command("scheduler_config", "dump", str(dumped))
    audits, prices = AuditLog.objects.count(), PriceVersion.objects.count()
    load(dumped)
    assert config_live() == before
    assert (AuditLog.objects.count(), PriceVersion.objects.count()) == (audits, prices)
    assert config_dump_text() == dumped.read_text()


def test_loading_the_same_file_twice_creates_no_price_version(loaded, capsys):
    prices = PriceVersion.objects.count()
    load(EXAMPLE)
    assert PriceVersion.objects.count() == prices
    assert "no changes" in capsys.readouterr().out


def test_price_change_adds_a_version_and_keeps_history(loaded, tmp_path):
    text = EXAMPLE.read_text().replace("price_factor: 1.6", "price_factor: 1.8", 1)
    assert "1.8" in text
    changed = tmp_path / "dearer.yaml"
    changed.write_text(text)
    load(changed)
    interactive = PriorityClass.objects.get(name="INTERACTIVE")
    assert [v.price_factor for v in interactive.prices.order_by("pk")] == [Decimal("1.6"), Decimal("1.8")]
    assert config_live().class_named("INTERACTIVE").price_factor == Decimal("1.8")
    assert AuditLog.objects.filter(entity="class", key="INTERACTIVE", field="price_factor").count() == 2


def test_absent_rows_are_deactivated_not_deleted(loaded, tmp_path):
    rule_names = list(DowngradeRule.objects.values_list("name", flat=True))
    partial = tmp_path / "rules.yaml"
    partial.write_text("scheduler:\n  downgrade_check: []\n")
    load(partial)
    assert sorted(DowngradeRule.objects.values_list("name", flat=True)) == sorted(rule_names)
    assert not DowngradeRule.objects.filter(active=True).exists()
    assert config_live().downgrade_rules == ()
    assert PriorityClass.objects.filter(active=True).count() == 4  # untouched section


BAD_EDITS = [
    ("sla_ms: 3000,", "sla_ms: -5,", "sla_ms"),
    ("min_share: 0.02", "min_share: 1.5", "min_share"),
    ('"0.80-0.95"', '"0.70-0.95"', "segments"),
    ("action: DOWNGRADE_TO_NEAR_RT", "action: DOWNGRADE_TO_NOWHERE", "action"),
    ("class==INTERACTIVE and prompt_tokens>8000", "class==PLATINUM and prompt_tokens>8000", "if"),
    ("class==INTERACTIVE and prompt_tokens>8000", "class==INTERACTIVE and and prompt_tokens", "if"),
    ("10.20.0.0/16", "10.20.0.0/33", "BATCH_NET"),
]


@pytest.mark.parametrize("old, new, field", BAD_EDITS)
def test_bad_file_is_refused_naming_file_line_and_field_and_changes_nothing(loaded, tmp_path, old, new, field):
    text = EXAMPLE.read_text()
    assert old in text, f"example no longer contains {old!r}"
    edited = text.replace(old, new, 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(edited)
    before, audits = config_dump_text(), AuditLog.objects.count()
    with pytest.raises(CommandError) as info:
        load(bad)
    assert info.value.returncode == 2
    message = str(info.value)
    assert "bad.yaml" in message and field in message
    line = next(number for number, content in enumerate(edited.splitlines(), 1) if new in content)
    assert f":{line}:" in message
    assert config_dump_text() == before and AuditLog.objects.count() == audits


def test_unparseable_yaml_and_missing_file_exit_2(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("scheduler:\n  classes: [\n")
    for path in (broken, tmp_path / "nope.yaml"):
        with pytest.raises(CommandError) as info:
            load(path)
        assert info.value.returncode == 2 and path.name in str(info.value)
    assert not PriorityClass.objects.exists()


def test_backend_fallback_round_trips(loaded, tmp_path):
    assert Backend.objects.filter(enabled=True).exists()
    call_command(
        "backend",
        "create",
        "spare",
        "--url",
        "http://127.0.0.1:9200/v1",
        "--model",
        "sim-llama",
        "--slots",
        "2",
        "--fallback-for",
        Backend.objects.first().name,
    )
    dumped = tmp_path / "d.yaml"
    call_command("scheduler_config", "dump", str(dumped))
    assert "fallback_for" in dumped.read_text()
    load(dumped)
    assert Backend.objects.get(name="spare").fallback_for is not None
    load(EXAMPLE)  # the file does not name `spare`: disabled, kept
    assert Backend.objects.get(name="spare").enabled is False


def test_a_headroom_section_is_stored_and_dumped_beside_aging(loaded, tmp_path):
    part = tmp_path / "headroom.yaml"
    part.write_text("scheduler:\n  headroom: {enabled: true, max_slots: 4, hold_ms: 3000}\n")
    load(part)
    headroom = config_live().headroom
    assert (headroom.enabled, headroom.max_slots, headroom.hold_ms) == (True, 4, 3000)
    text = config_dump_text()
    assert text.index("  aging:") < text.index("  headroom:") < text.index("  tenant_fairness:")
    dumped = tmp_path / "dump.yaml"
    dumped.write_text(text)
    load(dumped)
    assert config_live().headroom == headroom
