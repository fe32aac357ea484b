"""Writes to the live configuration. Each runs in one transaction and audits every changed field.

`config_apply` replaces the sections a file names: rows absent from a replaced section are
deactivated, never deleted, because prices, charges and events refer to them. Applying the live
configuration to itself changes nothing (no audit row, no new price version).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from audit.services import audit_record, jsonable
from scheduling.engine.model import BackendSpec, ClassSpec, SchedulerConfig, TenantSpec
from scheduling.models import (
    AgingSegment,
    Backend,
    DowngradeRule,
    NetworkGroup,
    PriorityClass,
    SchedulerPolicy,
)
from scheduling.prices import backend_prices_check, factors_check, price_book
from scheduling.selectors import policy_get
from tenants.models import Tenant

_M = TypeVar("_M", bound=models.Model)

SECTIONS = (
    "classes",
    "aging",
    "headroom",
    "tenant_fairness",
    "queue",
    "downgrade_check",
    "networks",
    "policy",
    "tenants",
    "backends",
)


@dataclass
class ApplyResult:
    changes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def _sync_row(model: type[_M], *, lookup: dict, values: dict, entity: str, actor: str, result: ApplyResult) -> _M:
    """Create the row or update the fields that differ, auditing each change."""
    key = str(next(iter(lookup.values())))
    row = model._default_manager.filter(**lookup).first()  # `objects`: no model here has another manager
    if row is None:
        row = model._default_manager.create(**lookup, **values)
        audit_record(actor=actor, action="create", entity=entity, key=key, new=values)
        result.changes.append(f"created {entity} {key}")
        return row
    dirty = []
    for name, new in values.items():
        old = getattr(row, name)
        if old != new:
            audit_record(actor=actor, action="update", entity=entity, key=key, field_name=name, old=old, new=new)
            result.changes.append(f"{entity} {key}: {name} {jsonable(old)!r} -> {jsonable(new)!r}")
            setattr(row, name, new)
            dirty.append(name)
    if dirty:
        row.save(update_fields=dirty)
    return row


def _deactivate_absent(
    qs: models.QuerySet, *, keep: Iterable[str], key_field: str, flag: str, entity: str, actor: str, result: ApplyResult
) -> None:
    for row in qs.filter(**{flag: True}).exclude(**{f"{key_field}__in": list(keep)}).order_by("pk"):
        setattr(row, flag, False)
        row.save(update_fields=[flag])
        key = getattr(row, key_field)
        audit_record(actor=actor, action="deactivate", entity=entity, key=key, field_name=flag, old=True, new=False)
        result.changes.append(f"deactivated {entity} {key}")


def _apply_classes(classes: tuple[ClassSpec, ...], *, actor: str, result: ApplyResult, confirm: bool) -> None:
    prices = price_book()
    current: dict[str, Decimal] = prices.factors_at(timezone.now())
    changed = [
        (c.name, c.price_factor)
        for c in classes
        if current.get(c.name) is None or Decimal(current[c.name]) != c.price_factor
    ]
    factors_check(changed, confirm=confirm)
    for spec in classes:
        row = _sync_row(
            PriorityClass,
            lookup={"name": spec.name},
            values={"level": spec.level, "sla_ms": spec.sla_ms, "active": True},
            entity="class",
            actor=actor,
            result=result,
        )
        old_price = current.get(spec.name)
        if old_price is None or Decimal(old_price) != spec.price_factor:
            prices.version_add(row, spec.price_factor, actor)
            result.changes.append(f"class {spec.name}: price_factor {old_price} -> {spec.price_factor}")
    _deactivate_absent(
        PriorityClass.objects.all(),
        keep=[c.name for c in classes],
        key_field="name",
        flag="active",
        entity="class",
        actor=actor,
        result=result,
    )


def _apply_policy_fields(config: SchedulerConfig, sections: set[str], *, actor: str, result: ApplyResult) -> None:
    values: dict[str, Any] = {}
    if "policy" in sections:
        values["policy"] = config.policy.value
    if "aging" in sections:
        values["aging_mode"] = config.aging.mode
    if "tenant_fairness" in sections:
        fairness = config.fairness
        values.update(
            fairness_mode=fairness.mode.value, weight_source=fairness.weight_source, min_share=fairness.min_share
        )
    if "queue" in sections:
        values["queue"] = {k: getattr(config.queue, k) for k in config.queue.__dataclass_fields__}
    if "headroom" in sections:
        values["headroom"] = {k: getattr(config.headroom, k) for k in config.headroom.__dataclass_fields__}
    if values:
        policy_get()  # make sure the singleton exists
        _sync_row(SchedulerPolicy, lookup={"pk": 1}, values=values, entity="policy", actor=actor, result=result)
    if "aging" in sections:
        _apply_aging_segments(config, actor=actor, result=result)


def _apply_aging_segments(config: SchedulerConfig, *, actor: str, result: ApplyResult) -> None:
    wanted = [(s.lo, s.hi, s.boost.value, s.k) for s in config.aging.segments]
    have = [(s.wait_ratio_lo, s.wait_ratio_hi, s.boost, s.k) for s in AgingSegment.objects.order_by("position")]
    if wanted == have:
        return
    AgingSegment.objects.all().delete()  # segments are a value of the policy, not history
    AgingSegment.objects.bulk_create(
        AgingSegment(position=i, wait_ratio_lo=lo, wait_ratio_hi=hi, boost=boost, k=k)
        for i, (lo, hi, boost, k) in enumerate(wanted)
    )
    audit_record(
        actor=actor, action="update", entity="policy", key="aging", field_name="segments", old=have, new=wanted
    )
    result.changes.append("aging segments replaced")


def _apply_rules(config: SchedulerConfig, *, actor: str, result: ApplyResult) -> None:
    for rule in config.downgrade_rules:
        _sync_row(
            DowngradeRule,
            lookup={"name": rule.name},
            values={
                "condition": rule.condition,
                "action": rule.action,
                "enabled": rule.enabled,
                "order": rule.order,
                "active": True,
            },
            entity="rule",
            actor=actor,
            result=result,
        )
    _deactivate_absent(
        DowngradeRule.objects.all(),
        keep=[r.name for r in config.downgrade_rules],
        key_field="name",
        flag="active",
        entity="rule",
        actor=actor,
        result=result,
    )


def _apply_networks(config: SchedulerConfig, *, actor: str, result: ApplyResult) -> None:
    for name, cidrs in config.networks.items():
        _sync_row(
            NetworkGroup,
            lookup={"name": name},
            values={"cidrs": list(cidrs), "active": True},
            entity="network",
            actor=actor,
            result=result,
        )
    _deactivate_absent(
        NetworkGroup.objects.all(),
        keep=list(config.networks),
        key_field="name",
        flag="active",
        entity="network",
        actor=actor,
        result=result,
    )


def tenant_values(spec: TenantSpec) -> dict:
    return {
        "name": spec.name or spec.slug,
        "quota_share": Decimal(str(spec.quota_share)),
        "annual_budget": spec.annual_budget,
        "allowed_classes": list(spec.classes),
        "vip": spec.vip,
        "active": spec.active,
    }


def _apply_tenants(tenants: tuple[TenantSpec, ...], *, actor: str, result: ApplyResult) -> None:
    for spec in tenants:
        _sync_row(
            Tenant, lookup={"slug": spec.slug}, values=tenant_values(spec), entity="tenant", actor=actor, result=result
        )
    _deactivate_absent(
        Tenant.objects.all(),
        keep=[t.slug for t in tenants],
        key_field="slug",
        flag="active",
        entity="tenant",
        actor=actor,
        result=result,
    )


def backend_values(spec: BackendSpec) -> dict:
    return {
        "url": spec.url,
        "model_names": list(spec.models),
        "embedding_models": list(spec.embedding_models),
        "slots": spec.slots,
        "tpm": spec.tpm,
        "rpm": spec.rpm,
        "input_price_per_1k": spec.input_price_per_1k,
        "output_price_per_1k": spec.output_price_per_1k,
        "reserved_slots": spec.reserved_slots,
        "enabled": spec.enabled,
        "api_key_env": spec.api_key_env or "",
        "headers": dict(spec.headers),
        "dialect": spec.dialect.value,
        "deployment": spec.deployment or "",
        "api_version": spec.api_version or "",
    }


def _apply_backends(backends: tuple[BackendSpec, ...], *, actor: str, result: ApplyResult) -> None:
    rows = {}
    for spec in backends:
        backend_prices_check(
            name=spec.name, input_price_per_1k=spec.input_price_per_1k, output_price_per_1k=spec.output_price_per_1k
        )
    for spec in backends:
        rows[spec.name] = _sync_row(
            Backend,
            lookup={"name": spec.name},
            values=backend_values(spec),
            entity="backend",
            actor=actor,
            result=result,
        )
    for spec in backends:  # second pass: fallbacks may name a backend defined later in the file
        fallback = rows[spec.fallback_for] if spec.fallback_for else None
        _sync_row(
            Backend,
            lookup={"name": spec.name},
            values={"fallback_for": fallback},
            entity="backend",
            actor=actor,
            result=result,
        )
    _deactivate_absent(
        Backend.objects.all(),
        keep=list(rows),
        key_field="name",
        flag="enabled",
        entity="backend",
        actor=actor,
        result=result,
    )


@transaction.atomic
def config_apply(*, config: SchedulerConfig, sections: Iterable[str], actor: str, confirm: bool = False) -> ApplyResult:
    """Replace the named sections of the live configuration with `config`'s. A price refused by
    scheduling.prices (out of range; moved more than 2x without ``confirm``) changes nothing."""
    sections = set(sections)
    unknown = sections - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections: {', '.join(sorted(unknown))}")
    result = ApplyResult()
    if "classes" in sections:
        _apply_classes(config.classes, actor=actor, result=result, confirm=confirm)
    _apply_policy_fields(config, sections, actor=actor, result=result)
    if "networks" in sections:
        _apply_networks(config, actor=actor, result=result)
    if "downgrade_check" in sections:
        _apply_rules(config, actor=actor, result=result)
    if "tenants" in sections and config.tenants is not None:
        _apply_tenants(config.tenants, actor=actor, result=result)
    if "backends" in sections and config.backends is not None:
        _apply_backends(config.backends, actor=actor, result=result)
    return result


@transaction.atomic
def backend_create(*, spec: BackendSpec, actor: str) -> Backend:
    if Backend.objects.filter(name=spec.name).exists():
        raise ValidationError(f"backend {spec.name!r} already exists")
    if not spec.models:
        raise ValidationError("a backend serves at least one model (--model)")
    if not set(spec.embedding_models) <= set(spec.models):
        raise ValidationError("each --embedding-model must be one of the backend's --model")
    if spec.slots < 1:
        raise ValidationError(f"slots must be at least 1, not {spec.slots}")
    if not 0 <= spec.reserved_slots <= spec.slots:
        raise ValidationError(f"reserved slots must be between 0 and slots ({spec.slots})")
    if any(v is not None and v < 1 for v in (spec.tpm, spec.rpm)):
        raise ValidationError("tpm and rpm must be positive")
    backend_prices_check(
        name=spec.name, input_price_per_1k=spec.input_price_per_1k, output_price_per_1k=spec.output_price_per_1k
    )
    fallback = None
    if spec.fallback_for:
        fallback = Backend.objects.filter(name=spec.fallback_for).first()
        if fallback is None:
            raise ValidationError(f"--fallback-for names no backend: {spec.fallback_for!r}")
    backend = Backend(name=spec.name, fallback_for=fallback, **backend_values(spec))
    backend.full_clean()
    backend.save()
    audit_record(actor=actor, action="create", entity="backend", key=spec.name, new=backend_values(spec))
    return backend
