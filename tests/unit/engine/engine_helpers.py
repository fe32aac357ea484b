"""Builders shared by the engine tests (plain Python, no Django)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from scheduling.engine import (
    AgingPolicy,
    AgingSegment,
    BackendSpec,
    Boost,
    ClassSpec,
    FairnessMode,
    FairnessPolicy,
    QueuePolicy,
    Request,
    Scheduler,
    SchedulerConfig,
    TenantSpec,
)
from scheduling.engine.model import HEADROOM_OFF, HeadroomPolicy

REPORT_SEGMENTS = (
    AgingSegment(0.0, 0.5, Boost.NONE),
    AgingSegment(0.5, 0.8, Boost.LINEAR, 1.0),
    AgingSegment(0.8, 0.95, Boost.QUADRATIC, 2.2),
    AgingSegment(0.95, None, Boost.PREEMPT),
)
CLASSES = (
    ClassSpec("INTERACTIVE", 0, 3000, Decimal("1.6")),
    ClassSpec("NEAR_RT", 1, 15000, Decimal("1.2")),
    ClassSpec("BATCH", 2, 1_800_000, Decimal("0.7")),
    ClassSpec("RETRY", 3, 3_600_000, Decimal("0.4")),
)


def config(
    *,
    aging: str = "piecewise",
    fairness: FairnessMode = FairnessMode.WEIGHTED_FAIR_TOKENS,
    classes: tuple[ClassSpec, ...] = CLASSES,
    min_share: float = 0.02,
    headroom: HeadroomPolicy = HEADROOM_OFF,
    **queue: object,
) -> SchedulerConfig:
    """The test classes and aging; headroom off unless given (the dispatch order these tests pin has
    no holds and no deadline rescue; the default, on, has its own tests: ``test_headroom_spare``, the
    ``Default`` property tests)."""
    segments = REPORT_SEGMENTS if aging == "piecewise" else ()
    queue.setdefault("enforce_depth", False)
    return SchedulerConfig(
        classes=classes,
        aging=AgingPolicy(mode=aging, segments=segments),
        fairness=FairnessPolicy(mode=fairness, min_share=min_share),
        queue=QueuePolicy(**queue),
        headroom=headroom,
    )


def with_sla(cfg: SchedulerConfig, name: str, sla_ms: int) -> SchedulerConfig:
    return replace(cfg, classes=tuple(replace(c, sla_ms=sla_ms) if c.name == name else c for c in cfg.classes))


def tenants(*specs: tuple[str, float]) -> list[TenantSpec]:
    return [TenantSpec(slug, share) for slug, share in specs]


def backend(name: str = "gpu", slots: int = 1, models: tuple[str, ...] = ("m",), **kw: object) -> BackendSpec:
    return BackendSpec(name=name, models=models, slots=slots, **kw)


def scheduler(
    cfg: SchedulerConfig | None = None,
    *,
    slots: int = 1,
    backends: list[BackendSpec] | None = None,
    tenant_specs: list[TenantSpec] | None = None,
) -> Scheduler:
    return Scheduler(
        cfg or config(),
        tenants=tenant_specs if tenant_specs is not None else tenants(("a", 0.5), ("b", 0.5)),
        backends=backends if backends is not None else [backend(slots=slots)],
    )


def req(
    rid: str,
    *,
    tenant: str = "a",
    cls: str = "BATCH",
    at: int = 0,
    prompt: int = 100,
    out: int = 100,
    model: str = "m",
    deadline: int | None = None,
    vip: bool = False,
) -> Request:
    return Request(rid, tenant, cls, model, prompt, out, at, deadline, vip)


def submit(sched: Scheduler, *requests: Request) -> None:
    for r in requests:
        admission = sched.submit(r, now_ms=r.enqueued_ms)
        assert admission.admitted, (r.id, admission)


def drain_order(sched: Scheduler, now_ms: int, *, complete: bool = True) -> list[str]:
    """Dispatch one request at a time at a frozen clock, completing each; returns the ids in order."""
    order: list[str] = []
    while True:
        grants = sched.dispatch(now_ms=now_ms)
        if not grants:
            return order
        for grant in grants:
            order.append(grant.request.id)
            if complete:
                r = grant.request
                sched.complete(
                    r.id, now_ms=now_ms, prompt_tokens=r.prompt_tokens, output_tokens=r.expected_output_tokens
                )
