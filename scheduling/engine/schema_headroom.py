"""The ``headroom:`` section of the scheduler configuration (predictive headroom, ``headroom.py``).

Its keys, their defaults and what each does: docs/configuration.md, "The headroom section".
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from scheduling.engine.forecast import DAY_MS
from scheduling.engine.model import HeadroomPolicy

if TYPE_CHECKING:
    from scheduling.engine.schema import Checker

KEYS = tuple(f.name for f in fields(HeadroomPolicy))
_INTEGERS = {"horizon_ms": 1, "hold_ms": 1, "max_slots": 1, "bucket_ms": 60_000, "recent_ms": 1000, "rescue_ms": 0}


def headroom_section(ck: Checker, raw: Any) -> HeadroomPolicy | None:
    path, defaults = "scheduler.headroom", HeadroomPolicy()
    data, start = ck.mapping(path, raw, KEYS), len(ck.issues)
    if data is None:
        return None
    values: dict[str, Any] = {
        flag: ck.get(data, path, flag, ck.flag, default=getattr(defaults, flag)) for flag in ("enabled", "hold_idle")
    }
    for key, minimum in _INTEGERS.items():
        values[key] = ck.get(data, path, key, ck.integer, minimum=minimum, default=getattr(defaults, key))
    for key, rule, open_low in (
        ("min_expected", "> 0", True),
        ("profile_alpha", "in (0, 1]", True),
        ("profile_weight", "in [0, 1]", False),
        ("miss_share", "in [0, 1]", False),
        ("deadline_share", "in [0, 1]", False),
    ):
        high = None if key == "min_expected" else 1.0
        values[key] = ck.get(
            data, path, key, ck.real, low=0.0, high=high, open_low=open_low, default=getattr(defaults, key), rule=rule
        )
    bucket_ms = values["bucket_ms"]
    if isinstance(bucket_ms, int) and DAY_MS % bucket_ms:
        ck.error(f"{path}.bucket_ms", f"must divide a day ({DAY_MS} ms), e.g. 300000 (5 minutes), got {bucket_ms}")
    return None if len(ck.issues) > start else HeadroomPolicy(**values)


def headroom_dict(policy: HeadroomPolicy) -> dict[str, Any]:
    """The section's mapping: ``enabled`` and every key that differs from its default."""
    defaults = HeadroomPolicy()
    return {"enabled": policy.enabled} | {
        key: getattr(policy, key) for key in KEYS if getattr(policy, key) != getattr(defaults, key)
    }
