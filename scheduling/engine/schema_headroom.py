"""The ``headroom:`` section of the scheduler configuration (predictive headroom, ``headroom.py``).

headroom:
  enabled: true          # off unless set (and off in the fifo/strict/linear presets)
  horizon_ms: 4000       # hold when top-class arrivals are expected within this long
  hold_ms: 8000          # a freed slot stays free at most this long
  max_slots: 6           # at most this many slots held at once
  min_expected: 0.5      # expected arrivals within the horizon that justify a hold
  bucket_ms: 300000      # the time-of-day profile's bucket (must divide a day)
  profile_alpha: 0.5     # weight of the newest day in a bucket's average
  recent_ms: 60000       # time constant of the recent arrival rate
  profile_weight: 0.5    # the profile's share of the forecast (the rest: the recent rate)
  hold_idle: false       # also hold free slots that did not just free (an idle pool a lower class fills at once)
  miss_share: 0          # > 0: at most the slots the pool's turnover needs for this share of arrivals to find none held
  rescue_ms: 0           # > 0: inside a class, a request this close to its deadline is served before the fair order
                         # (earliest deadline first among those at risk); applies with or without enabled
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
