"""Scenario files: JSON describing configuration, backends, tenants and a request trace.

A scenario names its config (a YAML path or inline), backends, tenants, explicit requests or a
requests file, seeded generators (sim.generators), and defaults for the run; its ``backends`` and
``tenants`` take the place of those sections of the config. The keys: docs/simulator.md,
"Scenario files"; examples in ``sim/scenarios/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from scheduling.engine.model import BackendSpec, SchedulerConfig, TenantSpec
from scheduling.engine.schema import config_from_dict, config_from_yaml
from sim.generators import TraceRequest, generate

DEFAULT_TIMELINE_STEP_MS = 300_000
DEFAULT_JAIN_WINDOW_MS = 60_000


@dataclass
class Scenario:
    name: str
    config: SchedulerConfig
    tenants: tuple[TenantSpec, ...]
    backends: tuple[BackendSpec, ...]
    requests: list[TraceRequest]
    seed: int
    notes: str = ""
    timeline_step_ms: int = DEFAULT_TIMELINE_STEP_MS
    jain_window_ms: int = DEFAULT_JAIN_WINDOW_MS
    clock_origin: str | None = None
    small_tenants: tuple[str, ...] = ()
    horizon_ms: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _config(raw: Any, base: Path) -> SchedulerConfig:
    if isinstance(raw, str):
        path = (base / raw).resolve()
        return config_from_yaml(path.read_text(encoding="utf-8"), source=str(path))
    if isinstance(raw, dict):
        return config_from_dict(raw.get("scheduler", raw), source="scenario config")
    raise ValueError("scenario 'config' must be a path or an object")


def _tenant(raw: dict) -> TenantSpec:
    return TenantSpec(
        slug=raw["slug"],
        quota_share=float(raw["quota_share"]),
        name=raw.get("name", ""),
        classes=tuple(raw.get("classes", ())),
        vip=bool(raw.get("vip", False)),
    )


def _backend(raw: dict) -> BackendSpec:
    return BackendSpec(
        name=raw["name"],
        models=tuple(raw.get("models", ["m"])),
        slots=int(raw["slots"]),
        tpm=raw.get("tpm"),
        rpm=raw.get("rpm"),
        reserved_slots=int(raw.get("reserved_slots", 0)),
        input_price_per_1k=Decimal(str(raw.get("input_price_per_1k", "0"))),
        output_price_per_1k=Decimal(str(raw.get("output_price_per_1k", "0"))),
    )


def _explicit(raw: dict, n: int) -> TraceRequest:
    return TraceRequest(
        id=str(raw.get("id", f"r{n}")),
        at_ms=int(raw["at_ms"]),
        tenant=raw["tenant"],
        declared=raw["class"],
        model=raw.get("model", "m"),
        prompt_tokens=int(raw.get("prompt_tokens", 0)),
        output_tokens=int(raw.get("output_tokens", 0)),
        service_ms=int(raw["service_ms"]),
        max_tokens=raw.get("max_tokens"),
        patience_ms=raw.get("patience_ms"),
        timeout_ms=raw.get("timeout_ms"),
        src_ip=raw.get("src_ip"),
    )


def _trace(raw: dict, base: Path, seed: int) -> list[TraceRequest]:
    rows: list[dict] = list(raw.get("requests", []))
    if raw.get("requests_file"):
        lines = (base / raw["requests_file"]).read_text(encoding="utf-8").splitlines()
        rows.extend(json.loads(line) for line in lines if line.strip())
    trace = [_explicit(r, n) for n, r in enumerate(rows)]
    for index, gen in enumerate(raw.get("generators", [])):
        trace.extend(generate(gen, index=index, seed=seed))
    trace.sort(key=lambda r: r.at_ms)  # stable: ties keep file order
    ids = {r.id for r in trace}
    if len(ids) != len(trace):
        raise ValueError("request ids must be unique")
    return trace


def _small_tenants(raw: dict, config: SchedulerConfig, tenants: tuple[TenantSpec, ...]) -> tuple[str, ...]:
    if "small_tenants" in raw:
        return tuple(raw["small_tenants"])
    floor = config.fairness.min_share
    return tuple(t.slug for t in tenants if t.quota_share <= floor + 1e-12)


def scenario_from_dict(raw: dict, *, base: Path, seed: int | None = None) -> Scenario:
    config = _config(raw["config"], base)
    tenants = tuple(_tenant(t) for t in raw["tenants"]) if "tenants" in raw else (config.tenants or ())
    backends = tuple(_backend(b) for b in raw["backends"]) if "backends" in raw else (config.backends or ())
    config = replace(config, tenants=tenants, backends=backends)
    seed = int(raw.get("seed", 1)) if seed is None else seed
    return Scenario(
        name=raw.get("name", "scenario"),
        config=config,
        tenants=tenants,
        backends=backends,
        requests=_trace(raw, base, seed),
        seed=seed,
        notes=raw.get("notes", ""),
        timeline_step_ms=int(raw.get("timeline_step_ms", DEFAULT_TIMELINE_STEP_MS)),
        jain_window_ms=int(raw.get("jain_window_ms", DEFAULT_JAIN_WINDOW_MS)),
        clock_origin=raw.get("clock_origin"),
        small_tenants=_small_tenants(raw, config, tenants),
        horizon_ms=raw.get("horizon_ms"),
        raw=raw,
    )


def load_scenario(path: str | Path, *, seed: int | None = None) -> Scenario:
    path = Path(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    return scenario_from_dict(raw, base=path.parent, seed=seed)
