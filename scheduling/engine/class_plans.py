"""Per-class values that every submit and dispatch needs, computed once per configuration.

A :class:`ClassPlan` is derived from a class's spec, the aging curve and the queue policy. The
scheduler builds one per class (configured or retired) whenever the configuration is applied,
so a plan never outlives the settings it was computed from and the hot path reads plain
attributes instead of looking the spec up and recomputing bounds on every decision. The
class's dispatch-rate window measures traffic, not settings: it is kept across
reconfigurations and only referenced here.
"""

from __future__ import annotations

import math

from .admission import RateWindow
from .aging import AgingCurve
from .model import ClassSpec


class ClassPlan:
    __slots__ = (
        "spec",
        "level",
        "sla_ms",
        "preempt_wait_ms",
        "first_wait_ms",
        "expires",
        "privileged",
        "dispatch_rate",
    )

    def __init__(
        self, spec: ClassSpec, aging: AgingCurve, *, expires: bool, top_level: int, dispatch_rate: RateWindow
    ) -> None:
        self.spec = spec
        self.level = spec.level
        self.sla_ms = spec.sla_ms
        wait_ms = aging.preempt_wait_ms(spec.sla_ms)
        # wait after which a request is at preempt, in whole ms as AgingCurve.preempt_at_ms rounds (None: never)
        self.preempt_wait_ms = None if wait_ms is None else math.ceil(wait_ms)
        # wait after which a request outranks every other class (boosted past the top class, or at
        # preempt): from then on its class takes every slot it may use as they free (None: never)
        first_ratio = aging.outranks_at(spec.level - top_level)
        self.first_wait_ms = None if first_ratio is None else math.ceil(first_ratio * spec.sla_ms)
        self.expires = expires  # the policy expires waiting requests at their deadline (see deadline_ms)
        self.privileged = spec.level <= top_level  # may use reserved slots (top class)
        self.dispatch_rate = dispatch_rate

    def deadline_ms(self, enqueued_ms: int, client_deadline_ms: int | None) -> int:
        """``min(enqueued + sla, the client's own deadline)``."""
        deadline = enqueued_ms + self.sla_ms
        return client_deadline_ms if client_deadline_ms is not None and client_deadline_ms < deadline else deadline
