"""Foreseen demand: predicted admission by the arrivals a previous day's profile expects.

Where a previous day covered the time to a new request's deadline, the engine's ``DemandProfile``
expects the other tenants' and the higher classes' arrivals within it; the request is admitted when
the slots start it after those that fair sharing and the class order put before it. The rule and
why: docs/engine.md, "Foreseen demand".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import admission as adm
from .class_plans import ClassPlan
from .counters import TenantInClass
from .outcomes import Admission

if TYPE_CHECKING:
    from .prediction import Prediction

FORESEEN_TURNOVERS = 10  # the profile decides for a request with at least this many service times left


def foreseen_refusal(
    prediction: Prediction,
    plan: ClassPlan,
    book: TenantInClass,
    tenant: str,
    left_ms: int,
    usable: int,
    rate_per_ms: float,
    now_ms: int,
) -> Admission | bool | None:
    """False to admit a new request of ``tenant`` (its ``book`` in the class), a ``queue_full`` to
    refuse it, None where the profile does not decide (no day covered the time to the deadline, or
    it is shorter than ``FORESEEN_TURNOVERS`` of the class's service times). ``rate_per_ms``:
    admission's ``R``, which bounds the starts too."""
    engine, cls = prediction.engine, plan.spec.name
    demand = engine.demand
    if demand is None:
        return None
    service_ms = prediction._service_now(cls)
    start = engine._backlog_service.get(cls)
    if start is not None and start[1] != math.inf:
        service_ms = max(service_ms, start[1])
    end_ms = now_ms + left_ms
    if left_ms < FORESEEN_TURNOVERS * service_ms or not demand.covers(now_ms, end_ms):
        return None
    depth = engine._depth_by_cls
    higher_ms = 0.0  # slot-ms the higher classes' waiting and foreseen requests take
    for name in engine._higher[cls]:
        higher_ms += (depth.get(name, 0) + demand.expected(name, "", now_ms, end_ms)) * prediction._service_now(name)
    starts = min(max(0.0, usable * left_ms - higher_ms) / service_ms, rate_per_ms * left_ms)
    if engine._fair_lanes:
        own = book.waiting + 1
        need = own + _others(prediction, cls, tenant, own, now_ms, end_ms)
    else:  # FIFO: after every request waiting in the class; none to come goes before it
        need = depth.get(cls, 0) + 1
    if need <= starts:
        return False
    rate = starts / left_ms if left_ms else 0.0
    return Admission(False, "queue_full", adm.retry_after_ms(math.ceil(need - starts), rate, plan.sla_ms))


def _others(prediction: Prediction, cls: str, tenant: str, own: int, now_ms: int, end_ms: int) -> float:
    """The other tenants' requests, waiting and foreseen, that fair sharing starts before the new
    one: each tenant's up to its weighted share of ``own``."""
    engine = prediction.engine
    demand, books = engine.demand, engine._books
    assert demand is not None
    weights, unknown = engine._tenant_weight, engine._unknown_weight
    share = own / weights.get(tenant, unknown)
    keys: dict[str, None] = {}
    for lane in engine._class_lanes.get(cls, ()):
        for key, tq in lane.tenants.items():
            if tq.live and key != tenant:
                keys[key] = None
    for key in demand.tenants.get(cls, ()):
        if key != tenant:
            keys[key] = None
    others = 0.0
    for key in keys:
        book = books.get((cls, key))
        wanted = (0 if book is None else book.waiting) + demand.expected(cls, key, now_ms, end_ms)
        others += min(wanted, share * weights.get(key, unknown))
    return others
