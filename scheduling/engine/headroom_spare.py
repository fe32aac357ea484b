"""What the lower classes can spare for headroom's holds (``headroom.deadline_share``).

A hold leaves a slot idle that a lower class would have used. ``spare_slots`` bounds the holds by
the lower classes' deadlines: going down the levels below the top, the queued work at or above a
class (its requests x their mean service time) must be dispatched on the slots that the classes
above it do not run on now before its oldest request has waited ``deadline_share`` of the class's
SLA (so its newest, which has waited no longer, has too). The holds get what is left, none while
any lower class is short, has a request at preempt, or has a backlog younger than the rate window
(admission is measuring its drain). Rules and why: docs/engine.md, "Headroom".
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import TYPE_CHECKING

from .admission import WINDOW_MS

if TYPE_CHECKING:
    from .class_plans import ClassPlan
    from .scheduler import Scheduler


class LowerSpare:
    """``spare_slots`` for one engine, its classes grouped by level once per configuration."""

    def __init__(self, engine: Scheduler) -> None:
        self.engine = engine
        self.plans: dict[str, ClassPlan] | None = None  # the plans the levels were grouped from
        self.levels: list[list[tuple[str, ClassPlan]]] = []

    def __call__(self, share: float, now_ms: int) -> int:
        plans = self.engine._plans
        if plans is not self.plans:  # a new configuration
            self.plans, self.levels = plans, by_level(plans)
        return spare_slots(self.engine, share, now_ms, self.levels)


def by_level(plans: dict[str, ClassPlan]) -> list[list[tuple[str, ClassPlan]]]:
    ordered = sorted(plans.items(), key=lambda item: item[1].level)
    return [list(group) for _, group in groupby(ordered, key=lambda item: item[1].level)]


def spare_slots(
    engine: Scheduler, share: float, now_ms: int, levels: list[list[tuple[str, ClassPlan]]] | None = None
) -> int:
    """Slots holds may take at ``now_ms`` without pushing a lower class's queued work past
    ``share`` of its SLA (0 when some lower class is short already)."""
    depth = engine._depth_by_cls
    running = engine._running_by_cls
    total = engine._capacity.total_slots
    spare = float(total)
    above = 0  # slots run by the classes above the level looked at
    ahead_ms = 0.0  # queued work at or above it (slot-ms)
    for classes in by_level(engine._plans) if levels is None else levels:
        for cls, plan in classes:
            if plan.privileged or not depth.get(cls):
                continue
            oldest_ms = _oldest_wait_ms(engine, cls, now_ms)
            left_ms = share * plan.sla_ms - oldest_ms  # for the newest too
            if left_ms <= 0 or _young(engine, cls, oldest_ms, now_ms):
                return 0
            ahead_ms += depth[cls] * engine.service_ms(cls)
            spare = min(spare, total - above - ahead_ms / left_ms)
        above += sum(running.get(cls, 0) for cls, _ in classes)
    return max(0, math.floor(spare))


def _young(engine: Scheduler, cls: str, oldest_ms: float, now_ms: int) -> bool:
    """Whether the class's backlog began within the rate window: admission (predicted, or the depth
    rule's throughput) is measuring its drain, and a hold now would lower what the rest of a burst
    is admitted on. Its backlog's start where the engine keeps it, else its oldest request's wait."""
    if engine._tracks_backlogs:
        since = engine._backlog_since.get(cls)
        return since is not None and now_ms - since < WINDOW_MS
    return oldest_ms < WINDOW_MS


def _oldest_wait_ms(engine: Scheduler, cls: str, now_ms: int) -> float:
    """How long the oldest waiting request of ``cls`` has waited (infinite: one is at preempt)."""
    waited_ms = 0
    for lane in engine._class_lanes.get(cls, ()):
        if lane.promoted:
            return math.inf
        oldest = engine.order.oldest(lane)
        if oldest is not None:
            waited_ms = max(waited_ms, now_ms - oldest.enqueued_ms)
    return waited_ms
