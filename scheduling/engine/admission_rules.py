"""Admission's two rules behind one interface: the dynamic depth limit, and predicted admission.

The engine holds one :class:`AdmissionRule`, picked from ``queue.admission`` whenever the
configuration is applied, and asks it on each submit (when ``queue.enforce_depth``) and for the
depth limit it reports. Both read the engine's counts and rates and keep no state of their own.
How each decides and why: docs/engine.md, "Admission".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from . import admission as adm
from .counters import TenantInClass
from .model import ClassSpec, Request
from .outcomes import Admission

if TYPE_CHECKING:
    from .prediction import Prediction
    from .scheduler import Scheduler


class AdmissionRule(Protocol):
    def refusal(self, request: Request, book: TenantInClass, now_ms: int) -> Admission | None:
        """A ``queue_full`` refusal of ``request`` (``book``: its tenant in its class), or None to admit."""

    def depth_limit(self, cls: str, now_ms: int) -> int:
        """The class depth this rule admits now (reported, and the depth rule's bound)."""


class DepthAdmission:
    """``queue.admission: depth``: the dynamic depth limit per class, fair between tenants."""

    def __init__(self, engine: Scheduler) -> None:
        self.engine = engine

    def refusal(self, request: Request, book: TenantInClass, now_ms: int) -> Admission | None:
        engine = self.engine
        spec = engine._classes[request.cls]
        limit = self.depth_limit(request.cls, now_ms)
        depth = engine._depth_by_cls.get(request.cls, 0)
        room = adm.tenant_room(engine._tenant_weight.get(request.tenant, engine._unknown_weight), limit)
        if adm.admits(depth, book.waiting, limit, room):
            return None
        drain_per_ms = adm.rate_window(engine._cls_rate, request.cls).count(now_ms) / adm.WINDOW_MS
        if drain_per_ms <= 0:
            drain_per_ms = self._free_slots_for(spec) / engine._service(engine._cls_service, request.cls)
        retry = adm.retry_after_ms(depth - limit + 1, drain_per_ms, spec.sla_ms)
        return Admission(False, "queue_full", retry)

    def depth_limit(self, cls: str, now_ms: int) -> int:
        engine = self.engine
        spec = engine._class_spec(cls)
        mean_ms = engine._service(engine._cls_service, cls)
        floor = adm.floor_depth(self._free_slots_for(spec), spec.sla_ms, mean_ms)
        dispatched = adm.rate_window(engine._cls_rate, cls).count(now_ms)
        return adm.depth_limit(dispatched, spec.sla_ms, floor, engine._config.queue.depth_cap)

    def _free_slots_for(self, spec: ClassSpec) -> int:
        engine = self.engine
        capacity = engine._capacity
        slots = capacity.total_slots - (0 if spec.level <= engine._top_level else capacity.total_reserved)
        for cls, running in engine._running_by_cls.items():
            if running and engine._class_spec(cls).level < spec.level:
                slots -= running
        return max(slots, 0)


class PredictedAdmission:
    """``queue.admission: predicted``: admitted when the request's predicted dispatch fits its deadline."""

    def __init__(self, engine: Scheduler, prediction: Prediction) -> None:
        self.engine = engine
        self.prediction = prediction

    def refusal(self, request: Request, book: TenantInClass, now_ms: int) -> Admission | None:
        plan = self.engine._plans[request.cls]
        deadline_ms = plan.deadline_ms(request.enqueued_ms, request.deadline_ms)
        return self.prediction.refusal(plan, book, request.tenant, deadline_ms, now_ms)

    def depth_limit(self, cls: str, now_ms: int) -> int:
        return self.prediction.limit(self.engine._plans[cls], now_ms)
