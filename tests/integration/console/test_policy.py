"""Policy edits: validated like the YAML (a bad rule refused with the parser's reason), applied
through config_apply / price_change, audited (who, old → new), and refused to non-admins."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from audit.models import AuditLog
from billing.models import PriceVersion
from console import policy
from scheduling.models import (
    AgingSegment,
    Backend,
    DowngradeRule,
    PriorityClass,
    SchedulerPolicy,
)
from scheduling.selectors import config_live


def test_a_rule_that_does_not_parse_is_refused_with_the_parsers_reason(world):
    with pytest.raises(ValidationError) as refused:
        policy.rule_save(
            name="bad", condition="class == INTERACTIVE and and", action="DOWNGRADE_TO_BATCH", enabled=True, actor="t"
        )
    text = "; ".join(refused.value.messages)
    assert "cannot parse condition" in text and "column" in text
    assert not DowngradeRule.objects.filter(name="bad").exists()


def test_a_rule_naming_an_unknown_network_or_class_is_refused(world):
    with pytest.raises(ValidationError, match="unknown network 'NOPE_NET'"):
        policy.rule_save(
            name="n", condition="src_cidr in NOPE_NET", action="DOWNGRADE_TO_BATCH", enabled=True, actor="t"
        )
    with pytest.raises(ValidationError, match="unknown action"):
        policy.rule_save(name="n", condition="max_tokens > 10", action="DOWNGRADE_TO_GOLD", enabled=True, actor="t")


def test_a_good_rule_is_saved_audited_and_live(world):
    before = AuditLog.objects.count()
    policy.rule_save(
        name="big-output",
        condition="class==INTERACTIVE and max_tokens>4000",
        action="DOWNGRADE_TO_NEAR_RT",
        enabled=True,
        actor="console:ada",
    )
    rule = DowngradeRule.objects.get(name="big-output")
    assert rule.active and rule.enabled and rule.action == "DOWNGRADE_TO_NEAR_RT"
    assert any(r.name == "big-output" for r in config_live().downgrade_rules)
    created = AuditLog.objects.filter(entity="rule", key="big-output", actor="console:ada")
    assert AuditLog.objects.count() > before and created.exists()
    policy.rule_delete(name="big-output", actor="console:ada")
    assert not any(r.name == "big-output" for r in config_live().downgrade_rules)
    assert AuditLog.objects.filter(entity="rule", key="big-output", action="deactivate").exists()


def test_price_change_creates_a_version_effective_now_and_audits(world):
    versions = PriceVersion.objects.filter(priority_class__name="BATCH").count()
    version = policy.class_price_set(class_name="BATCH", price_factor=Decimal("0.55"), actor="console:ada")
    assert PriceVersion.objects.filter(priority_class__name="BATCH").count() == versions + 1
    assert version.price_factor == Decimal("0.55") and version.created_by == "console:ada"
    assert next(c for c in config_live().classes if c.name == "BATCH").price_factor == Decimal("0.55")
    assert AuditLog.objects.filter(entity="class", key="BATCH", field="price_factor", actor="console:ada").exists()


def test_bad_price_is_refused(world):
    with pytest.raises(ValidationError, match="price factor"):
        policy.class_price_set(class_name="BATCH", price_factor=Decimal("-1"), actor="t")
    with pytest.raises(ValidationError, match="no class"):
        policy.class_price_set(class_name="GOLD", price_factor=Decimal("1"), actor="t")


def test_sla_change_is_audited_old_to_new(world):
    policy.class_sla_set(class_name="NEAR_RT", sla_ms=20000, actor="console:ada")
    assert PriorityClass.objects.get(name="NEAR_RT").sla_ms == 20000
    row = AuditLog.objects.get(entity="class", key="NEAR_RT", field="sla_ms")
    assert (row.old, row.new, row.actor) == (15000, 20000, "console:ada")
    assert PriceVersion.objects.filter(priority_class__name="NEAR_RT").count() == 1  # no new price version


def test_aging_segments_are_validated_and_replaced(world):
    with pytest.raises(ValidationError, match="gap"):
        policy.aging_set(
            mode="piecewise", segments=policy.segments_parse("0-0.5 none\n0.6-0.9 linear 1\n>=0.9 preempt"), actor="t"
        )
    policy.aging_set(
        mode="piecewise", segments=policy.segments_parse("0-0.6 none\n0.6-0.9 linear 2\n>=0.9 preempt"), actor="t"
    )
    assert [(s.wait_ratio_lo, s.boost) for s in AgingSegment.objects.all()] == [
        (0, "none"),
        (0.6, "linear"),
        (0.9, "preempt"),
    ]


def test_fairness_and_tenant_share(world):
    policy.fairness_set(mode="weighted_round_robin", min_share=0.05, actor="t")
    row = SchedulerPolicy.objects.get(pk=1)
    assert (row.fairness_mode, row.min_share) == ("weighted_round_robin", 0.05)
    with pytest.raises(ValidationError, match="min_share"):
        policy.fairness_set(mode="fifo", min_share=2.0, actor="t")
    policy.tenant_share_set(slug="sales", quota_share=Decimal("0.25"), actor="t")
    assert AuditLog.objects.filter(entity="tenant", key="sales", field="quota_share").exists()


def test_backend_edit(world):
    policy.backend_set(name="sim-gpu", values={"slots": 12, "reserved_slots": 2, "tpm": 90000}, actor="t")
    backend = Backend.objects.get(name="sim-gpu")
    assert (backend.slots, backend.reserved_slots, backend.tpm) == (12, 2, 90000)
    with pytest.raises(ValidationError, match="reserved_slots"):
        policy.backend_set(name="sim-gpu", values={"slots": 1, "reserved_slots": 5}, actor="t")


def test_policy_forms_refuse_with_the_reason_and_save(admin):
    response = admin.client.post(
        "/console/policy/rules/",
        {"name": "oops", "condition": "prompt_tokens >", "action": "DOWNGRADE_TO_BATCH", "enabled": "on"},
        follow=True,
    )
    page = response.content.decode()
    assert "Refused" in page and "cannot parse condition" in page
    response = admin.client.post("/console/policy/class/INTERACTIVE/", {"price_factor": "1.8"}, follow=True)
    assert "price ×1.8" in response.content.decode()
    assert "×1.8" in admin.client.get("/console/policy/").content.decode()
    audit = admin.client.get("/console/audit/?entity=class").content.decode()
    assert "console:ada" in audit and "price_factor" in audit


def test_policy_is_for_admins_only(member_a, finance):
    for persona in (member_a, finance):
        assert persona.client.post("/console/policy/class/INTERACTIVE/", {"price_factor": "9"}).status_code == 403
    assert not PriceVersion.objects.filter(price_factor=Decimal("9")).exists()


def test_boost_curve_follows_the_live_segments(world):
    from console.policy_view import boost_curve

    curve = boost_curve(config_live().aging)
    at = dict(zip(curve["ratios"], curve["boost"]))
    assert at[0.3] == 0 and at[0.65] == pytest.approx(0.5) and at[0.8] == pytest.approx(1.0)
    assert curve["preempt_ratio"] == 0.95 and at[1.0] is None
