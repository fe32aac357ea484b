"""Policy edits from the console. One implementation with the YAML file: each edit takes the live
configuration as the YAML schema's mapping, changes one thing, validates the whole mapping with
the schema (the same rule parser, class and network checks as ``scheduler_config load``) and
applies the changed section through ``scheduling.services.config_apply``, which audits every
changed field. The dispatcher polls the audit log, so a saved change reaches the running
scheduler within a second, without restart.

Every function raises ``ValidationError`` whose messages say what is wrong (a rule that does not
parse is refused with the parser's reason and column).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from billing.errors import BillingError
from billing.services import price_change
from gateway.api import tenant_update
from scheduling.engine.schema import ConfigError, config_from_dict, config_to_dict
from scheduling.models import PriceVersion
from scheduling.selectors import config_live
from scheduling.services import ApplyResult, config_apply

SOURCE = "console"


def _issues(exc: ConfigError) -> list[str]:
    return [f"{issue.field.removeprefix('scheduler.')}: {issue.message}" for issue in exc.issues]


@transaction.atomic
def policy_edit(*, section: str, change: Callable[[dict], None], actor: str) -> ApplyResult:
    """Change the live configuration's mapping with ``change``, validate it whole, apply ``section``."""
    data = config_to_dict(config_live())
    change(data)
    try:
        config = config_from_dict(data, source=SOURCE)
    except ConfigError as exc:
        raise ValidationError(_issues(exc)) from None
    return config_apply(config=config, sections=[section], actor=actor)


def _named(items: list[dict], key: str, name: str, what: str) -> dict:
    for item in items:
        if item.get(key) == name:
            return item
    raise ValidationError(f"no {what} {name!r}")


def number(raw: Any, *, what: str, kind: type = Decimal) -> Any:
    """Form text → int/float/Decimal, or a ValidationError naming the field."""
    if raw is None or str(raw).strip() == "":
        return None
    try:
        return kind(str(raw).strip()) if kind is not float else float(str(raw).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError(f"{what}: {raw!r} is not a number") from None


# --- classes ------------------------------------------------------------------------------


def class_sla_set(*, class_name: str, sla_ms: int, actor: str) -> ApplyResult:
    def change(data: dict) -> None:
        _named(data["classes"], "name", class_name, "class")["sla_ms"] = sla_ms

    return policy_edit(section="classes", change=change, actor=actor)


def class_price_set(
    *, class_name: str, price_factor: Decimal, actor: str, effective_at: datetime | None = None, confirm: bool = False
) -> PriceVersion:
    """A new price version (now or at ``effective_at``); admitted requests keep theirs. A move of
    more than 2x without ``confirm`` raises ConfirmNeeded (a ValidationError saying what it touches)."""
    try:
        return price_change(
            class_name=class_name, price_factor=price_factor, actor=actor, effective_at=effective_at, confirm=confirm
        )
    except BillingError as exc:
        raise ValidationError(str(exc)) from None


# --- aging and fairness -------------------------------------------------------------------


def segments_parse(text: str) -> list[dict]:
    """Lines ``<wait_ratio> <boost> [k]``, e.g. ``0.50-0.80 linear 1.0`` or ``>=0.95 preempt``."""
    segments = []
    for number_, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        if len(words) not in (2, 3):
            raise ValidationError(f"segment line {number_}: write '<wait_ratio> <boost> [k]', got {line.strip()!r}")
        segment: dict[str, Any] = {"wait_ratio": words[0], "boost": words[1]}
        if len(words) == 3:
            segment["k"] = number(words[2], what=f"segment line {number_} k", kind=float)
        segments.append(segment)
    return segments


def aging_set(*, mode: str, segments: list[dict], actor: str) -> ApplyResult:
    def change(data: dict) -> None:
        data["aging"] = {"mode": mode, "segments": segments}

    return policy_edit(section="aging", change=change, actor=actor)


def fairness_set(*, mode: str, min_share: float, actor: str) -> ApplyResult:
    def change(data: dict) -> None:
        data["tenant_fairness"].update(mode=mode, min_share=min_share)

    return policy_edit(section="tenant_fairness", change=change, actor=actor)


def tenant_share_set(*, slug: str, quota_share: Decimal, actor: str) -> None:
    tenant_update(slug=slug, actor=actor, quota_share=quota_share)


# --- downgrade rules ----------------------------------------------------------------------


def rule_save(*, name: str, condition: str, action: str, enabled: bool, actor: str) -> ApplyResult:
    """Add the rule, or replace the rule of that name in its place."""
    rule = {"name": name.strip(), "if": condition.strip(), "action": action.strip(), "enabled": enabled}

    def change(data: dict) -> None:
        rules = data.setdefault("downgrade_check", [])
        for index, existing in enumerate(rules):
            if existing["name"] == rule["name"]:
                rules[index] = rule
                return
        rules.append(rule)

    return policy_edit(section="downgrade_check", change=change, actor=actor)


def rule_delete(*, name: str, actor: str) -> ApplyResult:
    def change(data: dict) -> None:
        rules = data.get("downgrade_check", [])
        _named(rules, "name", name, "rule")
        data["downgrade_check"] = [r for r in rules if r["name"] != name]

    return policy_edit(section="downgrade_check", change=change, actor=actor)


# --- backends -----------------------------------------------------------------------------

BACKEND_FIELDS = (
    "slots",
    "tpm",
    "rpm",
    "input_price_per_1k",
    "output_price_per_1k",
    "fallback_for",
    "reserved_slots",
    "enabled",
)


def backend_set(*, name: str, values: dict[str, Any], actor: str) -> ApplyResult:
    """Change a backend's capacity, limits, prices, fallback or state (None clears tpm/rpm/fallback)."""
    unknown = set(values) - set(BACKEND_FIELDS)
    if unknown:
        raise ValidationError(f"backend fields {', '.join(sorted(unknown))} cannot be edited here")

    def change(data: dict) -> None:
        backend = _named(data.get("backends", []), "name", name, "backend")
        for field, value in values.items():
            if value is None:
                backend.pop(field, None)
            else:
                backend[field] = value

    return policy_edit(section="backends", change=change, actor=actor)
