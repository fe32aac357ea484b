"""The scheduler YAML of a test gateway, built from what the test cares about (one shape for every
test, not a copy of the whole file in each): its classes (by name, from the field report's four),
its tenants and its backends; anything else as extra top-level sections of ``scheduler:``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

# name -> (level, sla_ms, price_factor): the classes as live tests configure them
CLASSES = {
    "INTERACTIVE": (0, 3000, 1.6),
    "NEAR_RT": (1, 15000, 1.2),
    "BATCH": (2, 60000, 0.7),
    "RETRY": (3, 90000, 0.4),
}


def tenant(slug: str, *, budget: float | int = 1000, share: float = 0.3) -> dict[str, Any]:
    return {"slug": slug, "name": slug.capitalize(), "quota_share": share, "annual_budget": budget}


def backend(
    name: str,
    url: str,
    *,
    models: Iterable[str] = ("m",),
    slots: int = 2,
    input_per_1k: float | int = 1,
    output_per_1k: float | int = 2,
) -> dict[str, Any]:
    return {
        "name": name,
        "url": url,
        "models": list(models),
        "slots": slots,
        "input_price_per_1k": input_per_1k,
        "output_price_per_1k": output_per_1k,
    }


def scheduler_yaml(
    *,
    tenants: Iterable[Mapping[str, Any]],
    backends: Iterable[Mapping[str, Any]],
    classes: Iterable[str] = ("INTERACTIVE", "BATCH"),
    sla_ms: Mapping[str, int] | None = None,
    **sections: Any,
) -> str:
    """``sla_ms``: a class's SLA where the test needs another than `CLASSES`'."""
    chosen = []
    for name in classes:
        level, sla, factor = CLASSES[name]
        chosen.append({"name": name, "level": level, "sla_ms": (sla_ms or {}).get(name, sla), "price_factor": factor})
    body = {"classes": chosen, "tenants": [dict(t) for t in tenants], "backends": [dict(b) for b in backends]}
    return yaml.safe_dump({"scheduler": {**sections, **body}}, sort_keys=False)
