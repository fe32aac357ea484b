"""Reads of the live configuration: rows → the engine's plain SchedulerConfig."""

from __future__ import annotations

from decimal import Decimal
from typing import cast

from django.utils import timezone

from scheduling.engine.model import (
    AgingPolicy,
    BackendSpec,
    Boost,
    ClassSpec,
    Dialect,
    FairnessMode,
    FairnessPolicy,
    HeadroomPolicy,
    Policy,
    QueuePolicy,
    SchedulerConfig,
    TenantSpec,
)
from scheduling.engine.model import (
    AgingSegment as SegmentSpec,
)
from scheduling.engine.model import (
    DowngradeRule as RuleSpec,
)
from scheduling.models import (
    AgingSegment,
    Backend,
    DowngradeRule,
    NetworkGroup,
    PriorityClass,
    SchedulerPolicy,
)
from scheduling.prices import price_book
from tenants.models import Tenant


def class_names_active() -> set[str]:
    """The names a tenant's allowed classes and a key's default class may take (tenants.services)."""
    return set(PriorityClass.objects.filter(active=True).values_list("name", flat=True))


def policy_get() -> SchedulerPolicy:
    policy, _ = SchedulerPolicy.objects.get_or_create(pk=1)
    return policy


def tenant_spec(t: Tenant) -> TenantSpec:
    """What scheduling knows of a tenant (its share, classes, VIP flag, budget), from its row: the
    one reader of those fields, for the engine, the gateway's callers and billing's fallbacks."""
    return TenantSpec(
        slug=t.slug,
        name=t.name,
        quota_share=float(t.quota_share),
        annual_budget=None if t.annual_budget is None else _norm(t.annual_budget),
        classes=tuple(t.allowed_classes or ()),
        vip=t.vip,
        active=t.active,
    )


def tenant_specs(*, active_only: bool = True) -> tuple[TenantSpec, ...]:
    qs = Tenant.objects.filter(active=True) if active_only else Tenant.objects.all()
    return tuple(tenant_spec(t) for t in qs.order_by("slug"))


def backend_spec_of(b: Backend) -> BackendSpec:
    return BackendSpec(
        name=b.name,
        url=b.url,
        models=tuple(b.model_names),
        embedding_models=tuple(b.embedding_models),
        slots=b.slots,
        tpm=b.tpm,
        rpm=b.rpm,
        input_price_per_1k=_norm(b.input_price_per_1k),
        output_price_per_1k=_norm(b.output_price_per_1k),
        fallback_for=b.fallback_for.name if b.fallback_for else None,
        reserved_slots=b.reserved_slots,
        enabled=b.enabled,
        api_key_env=b.api_key_env or None,
        headers=tuple((str(k), str(v)) for k, v in (b.headers or {}).items()),
        dialect=Dialect(b.dialect),
        deployment=b.deployment or None,
        api_version=b.api_version or None,
    )


def backend_specs(*, enabled_only: bool = True) -> tuple[BackendSpec, ...]:
    qs = Backend.objects.select_related("fallback_for").order_by("name")
    if enabled_only:
        qs = qs.filter(enabled=True)
    return tuple(backend_spec_of(b) for b in qs)


def config_live() -> SchedulerConfig:
    """The whole live configuration (active rows only), as the engine and the YAML dump see it."""
    policy = policy_get()
    factors = price_book().factors_at(timezone.now())
    classes = tuple(
        ClassSpec(name=c.name, level=c.level, sla_ms=c.sla_ms, price_factor=_norm(factors.get(c.name)))
        for c in PriorityClass.objects.filter(active=True)
    )
    segments = tuple(
        SegmentSpec(lo=s.wait_ratio_lo, hi=s.wait_ratio_hi, boost=Boost(s.boost), k=s.k)
        for s in AgingSegment.objects.order_by("position")
    )
    rules = tuple(
        RuleSpec(name=r.name, condition=r.condition, action=r.action, enabled=r.enabled, order=r.order)
        for r in DowngradeRule.objects.filter(active=True).order_by("order", "name")
    )
    networks = {n.name: tuple(n.cidrs) for n in NetworkGroup.objects.filter(active=True).order_by("name")}
    return SchedulerConfig(
        classes=classes,
        aging=AgingPolicy(mode=policy.aging_mode, segments=segments),
        fairness=FairnessPolicy(
            mode=FairnessMode(policy.fairness_mode), weight_source=policy.weight_source, min_share=policy.min_share
        ),
        queue=QueuePolicy(**policy.queue),
        headroom=HeadroomPolicy(**policy.headroom),
        downgrade_rules=rules,
        networks=networks,
        policy=Policy(policy.policy),
        tenants=tenant_specs(),
        backends=backend_specs(enabled_only=False),
    )


def _norm(value: Decimal | None) -> Decimal:
    """Drop trailing zeros of a stored decimal without turning 10 into 1E+1."""
    if value is None:
        return Decimal("0")
    value = value.normalize()
    exponent = cast(int, value.as_tuple().exponent)  # a stored decimal is finite: its exponent is a number
    return value.quantize(Decimal(1)) if exponent > 0 else value
