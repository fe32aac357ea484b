"""Seeded synthetic request streams for scenario files (the ``generators`` list).

Each generator is a JSON object with a ``kind`` (``poisson``, ``burst``); every stream draws from
its own ``random.Random(seed, index)``, so adding a generator never changes the others' requests.
The fields and kinds: docs/simulator.md, "Scenario files".
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DAY_MS = 86_400_000


@dataclass(slots=True)
class TraceRequest:
    """One request of a scenario's trace (before classification)."""

    id: str
    at_ms: int
    tenant: str
    declared: str
    model: str
    prompt_tokens: int
    output_tokens: int
    service_ms: int
    max_tokens: int | None = None
    patience_ms: int | None = None
    timeout_ms: int | None = None
    src_ip: str | None = None


def _draw(rng: random.Random, spec: Any) -> int | None:
    if spec is None:
        return None
    if isinstance(spec, (int, float)):
        return int(spec)
    lo, hi = spec
    return rng.randint(int(lo), int(hi))


def _service_ms(rng: random.Random, spec: Any, output_tokens: int) -> int:
    if isinstance(spec, dict):
        return max(1, int(spec.get("base_ms", 0) + spec.get("per_output_token_ms", 0) * output_tokens))
    value = _draw(rng, spec)
    if value is None:
        raise ValueError("service_ms is required")
    return max(1, value)


def _make(rng: random.Random, gen: dict, tenant: str, at_ms: int, rid: str) -> TraceRequest:
    output_tokens = _draw(rng, gen.get("output_tokens", [100, 300])) or 0
    max_tokens = _draw(rng, gen["max_tokens"]) if "max_tokens" in gen else None
    return TraceRequest(
        id=rid,
        at_ms=at_ms,
        tenant=tenant,
        declared=gen["class"],
        model=gen.get("model", "m"),
        prompt_tokens=_draw(rng, gen.get("prompt_tokens", [500, 1500])) or 0,
        output_tokens=output_tokens,
        service_ms=_service_ms(rng, gen.get("service_ms"), output_tokens),
        max_tokens=max_tokens,
        patience_ms=_draw(rng, gen.get("patience_ms")),
        timeout_ms=_draw(rng, gen.get("timeout_ms")),
        src_ip=gen.get("src_ip"),
    )


def _on(at_ms: float, start_ms: int, gen: dict) -> bool:
    on_ms, off_ms = gen.get("on_ms"), gen.get("off_ms")
    if not on_ms or not off_ms:
        return True
    return (at_ms - start_ms) % (on_ms + off_ms) < on_ms


def _poisson_times(rng: random.Random, gen: dict) -> Iterator[int]:
    start_rate = float(gen["rate_per_s"]) / 1000.0
    end_rate = float(gen.get("rate_end_per_s", gen["rate_per_s"])) / 1000.0
    rate_per_ms = max(start_rate, end_rate)
    start_ms, end_ms = int(gen.get("start_ms", 0)), int(gen["end_ms"])
    if rate_per_ms <= 0:
        return
    ramp = end_rate != start_rate
    t = float(start_ms)
    while True:
        t += rng.expovariate(rate_per_ms)
        if t >= end_ms:
            return
        if ramp and rng.random() * rate_per_ms > start_rate + (end_rate - start_rate) * (t - start_ms) / (
            end_ms - start_ms
        ):
            continue
        if _on(t, start_ms, gen):
            yield int(t)


def _burst_times(gen: dict) -> Iterator[int]:
    count, at_ms, spread_ms = int(gen["count"]), int(gen.get("at_ms", 0)), int(gen.get("spread_ms", 0))
    for i in range(count):
        yield at_ms + (spread_ms * i) // count


def generate(gen: dict, *, index: int, seed: int) -> list[TraceRequest]:
    """The requests of generator number ``index`` of a scenario, for ``seed``."""
    tenants = gen["tenant"] if isinstance(gen["tenant"], list) else [gen["tenant"]]
    out: list[TraceRequest] = []
    for t_no, tenant in enumerate(tenants):
        rng = random.Random(f"{seed}:{index}:{t_no}")
        prefix = gen.get("id_prefix", f"g{index}")
        every_ms = int(gen.get("repeat_every_ms", DAY_MS))
        # lazily: each request's fields are drawn right after its time, from the same stream
        at = (t + r * every_ms for r in range(int(gen.get("repeat", 1))) for t in _times(rng, gen, index))
        out.extend(_make(rng, gen, tenant, at_ms, f"{prefix}-{tenant}-{n}") for n, at_ms in enumerate(at))
    return out


def _times(rng: random.Random, gen: dict, index: int) -> Iterator[int]:
    kind = gen.get("kind")
    if kind == "poisson":
        return _poisson_times(rng, gen)
    if kind == "burst":
        return _burst_times(gen)
    raise ValueError(f"generator {index}: unknown kind {kind!r}")
