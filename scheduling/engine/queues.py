"""The engine's queue keeping: its configuration applied, tickets into and out of the indexes.

``apply_config`` sets what the configuration determines (class plans, the classes above and below
each, the admission rule, the switches the hot paths read); ``rebuild`` recreates the lanes and
heaps from the store's tickets in queue order, keeping fair counters and backlog starts;
``enqueue``, ``unqueue`` and ``count_queued`` keep the lanes, heaps and counts as tickets come and
go. Functions over :class:`~scheduling.engine.scheduler.Scheduler`'s state (one implementation).
How a reconfiguration treats waiting requests: docs/engine.md, "Reconfiguration".
"""

from __future__ import annotations

from heapq import heapify, heappush
from typing import TYPE_CHECKING

from . import admission as adm
from .aging import AgingCurve
from .class_plans import ClassPlan
from .fairness import Lane
from .forecast import DemandProfile
from .model import ClassSpec, FairnessMode, SchedulerConfig
from .store import RUNNING, WAITING, Ticket

if TYPE_CHECKING:
    from .scheduler import Scheduler

DEADLINE_SLACK = 1024  # stale deadline entries tolerated beyond twice the waiting ones before a compaction
AGE_SLACK = 1024  # stale age-heap entries tolerated beyond twice a lane's waiting requests before a compaction


def apply_config(engine: Scheduler, config: SchedulerConfig) -> None:
    """Set the engine's configuration and what it determines: plans, class orders, switches, parts."""
    old = getattr(engine, "_config", None)
    engine._config = config
    engine._classes = {c.name: c for c in config.classes}
    if old is not None:
        held = {t.cls for t in engine._store.tickets()}
        for spec in (*old.classes, *engine._retired.values()):
            if spec.name not in engine._classes and spec.name in held:
                engine._retired[spec.name] = spec
    engine._retired = {k: v for k, v in engine._retired.items() if k not in engine._classes}
    engine._top_level = min((c.level for c in config.classes), default=0)
    engine._aging = AgingCurve(config.aging)
    engine._aging_on = engine._aging.active
    engine._single_queue = config.queue.single_queue
    engine._lanes_age = engine._aging_on and not engine._single_queue  # a lane's rank rises with its oldest wait
    queue = config.queue
    engine._enforce_depth = queue.enforce_depth
    engine._plans = {
        name: _plan_for(engine, spec) for name, spec in (*engine._classes.items(), *engine._retired.items())
    }
    engine._higher = {
        name: tuple(other for other, p in engine._plans.items() if p.level < plan.level)
        for name, plan in engine._plans.items()
    }
    engine._higher_rates = {  # (their dispatch-rate window, name), read on every predicted admission
        name: tuple((adm.rate_window(engine._cls_rate, other), other) for other in higher)
        for name, higher in engine._higher.items()
    }
    engine._lower = {
        name: tuple(other for other, p in engine._plans.items() if p.level > plan.level)
        for name, plan in engine._plans.items()
    }
    engine._predicted = queue.enforce_depth and queue.admission == "predicted" and not engine._single_queue
    engine.admission = engine._predicted_admission if engine._predicted else engine._depth_admission
    engine._fast_fail_on = queue.fast_fail and queue.enforce_deadline and not engine._single_queue
    engine._tracks_backlogs = engine._predicted or engine._fast_fail_on  # backlog starts: only prediction reads them
    engine._fair_lanes = config.fairness.mode != FairnessMode.FIFO and not engine._single_queue
    engine._predict_margin = queue.predict_margin
    engine._prior_weight = queue.prior_weight if engine._predicted else 0
    engine._margin_after_ms = queue.margin_after_ms if engine._predicted else 0
    engine._depth_cap = queue.depth_cap
    engine.headroom.apply(config.headroom, single_queue=engine._single_queue)
    bucket_ms, alpha = config.headroom.bucket_ms, config.headroom.profile_alpha
    if not engine._predicted:
        engine.demand = None
    elif engine.demand is None or not engine.demand.compatible(bucket_ms=bucket_ms, alpha=alpha):
        engine.demand = DemandProfile(bucket_ms=bucket_ms, alpha=alpha)
    # the deadline rescue needs deadlines (expiry) and a fair order to step out of
    engine._rescue_ms = config.headroom.rescue_ms if queue.enforce_deadline and not engine._single_queue else 0
    engine._weights()


def _plan_for(engine: Scheduler, spec: ClassSpec) -> ClassPlan:
    return ClassPlan(
        spec,
        engine._aging,
        expires=engine._config.queue.enforce_deadline,
        top_level=engine._top_level,
        dispatch_rate=adm.rate_window(engine._cls_rate, spec.name),
    )


def rebuild(engine: Scheduler) -> None:
    """Recreate lanes and heaps from the store's waiting tickets, in queue order."""
    old_vt = {key: lane.vt for key, lane in engine._lanes.items()}
    old_since, old_base = engine._backlog_since, engine._backlog_base
    engine._lanes, engine._lane_list, engine._preempt, engine._deadlines = {}, [], {}, []
    engine._rescue = {}
    engine._class_lanes = {}
    engine._promote_due_ms = float("inf")
    engine._promoted = engine._waiting = 0
    engine._depth_by_cls, engine._running_by_cls, engine._started_sum = {}, {}, {}
    engine._backlog_since, engine._backlog_base = {}, {}
    old_book_since = {key: (book.since_ms, book.base) for key, book in engine._books.items()}
    for book in engine._books.values():
        book.waiting, book.since_ms, book.idle_ms = 0, None, None
    tickets = sorted(engine._store.tickets(), key=lambda t: t.qseq)
    for ticket in tickets:
        ticket.book = engine._book(ticket.cls, ticket.tenant)
        if ticket.state == RUNNING:
            engine._running_by_cls[ticket.cls] = engine._running_by_cls.get(ticket.cls, 0) + 1
            engine._started_sum[ticket.cls] = engine._started_sum.get(ticket.cls, 0) + (ticket.dispatched_ms or 0)
        elif ticket.state == WAITING:
            ticket.promoted = False
            enqueue(engine, ticket, front=False, lift=False)
            count_queued(engine, ticket, +1)
    for key, lane in engine._lanes.items():
        lane.vt = old_vt.get(key, 0.0)
    for key, book in engine._books.items():  # a tenant still backlogged keeps its start
        if book.waiting and old_book_since[key][0] is not None:
            book.since_ms, book.base = old_book_since[key]
    for cls in engine._backlog_since:  # a class still backlogged keeps its start
        if cls in old_since:
            engine._backlog_since[cls], engine._backlog_base[cls] = old_since[cls], old_base[cls]
    since = engine._backlog_since
    engine._backlog_service = {c: v for c, v in engine._backlog_service.items() if since.get(c) == v[0]}


def lane_for(engine: Scheduler, cls: str, model: str) -> Lane:
    key = ("*", model) if engine._single_queue else (cls, model)
    lane = engine._lanes.get(key)
    if lane is None:
        level = 0 if engine._single_queue else engine._class_spec(cls).level
        mode = FairnessMode.FIFO if engine._single_queue else engine._config.fairness.mode
        lane = Lane(key[0], model, level, mode, engine._tenant_weight, engine._unknown_weight, engine._store)
        lane.sla_ms = 0 if engine._single_queue else engine._class_spec(cls).sla_ms
        engine._lanes[key] = lane
        adm.rate_window(engine._model_rate, model)  # dispatch counts into it without a lookup miss
        engine._lane_list.append(lane)
        engine._lane_list.sort(key=lambda ln: (ln.level, ln.name, ln.model))
        engine._class_lanes.setdefault(lane.name, []).append(lane)
    return lane


def enqueue(engine: Scheduler, ticket: Ticket, front: bool, lift: bool = True) -> None:
    """Put a waiting ticket into its lane and the age, deadline and rescue heaps."""
    plan = engine._plans[ticket.cls]
    lane = lane_for(engine, ticket.cls, ticket.model)
    lane.push(ticket, front, lift)
    enqueued = ticket.enqueued_ms
    # age heap key: when it reaches preempt, or (never preempting) when it was enqueued
    age_key_ms = enqueued if plan.preempt_wait_ms is None else enqueued + plan.preempt_wait_ms
    heappush(lane.age, (age_key_ms, ticket.id, ticket))
    if age_key_ms < engine._promote_due_ms:
        engine._promote_due_ms = age_key_ms
    if plan.expires:
        ticket.deadline_ms = plan.deadline_ms(enqueued, ticket.request.deadline_ms)
        heappush(engine._deadlines, (ticket.deadline_ms, ticket.id, ticket))
        if engine._rescue_ms:
            engine.order.rescue_push(lane, ticket, ticket.deadline_ms)
    else:
        ticket.deadline_ms = None


def count_queued(engine: Scheduler, ticket: Ticket, delta: int) -> None:
    """Count a ticket into (+1) or out of (-1) the queues, and the backlog starts prediction reads."""
    book = ticket.book
    assert book is not None, "set on admission"
    engine._waiting += delta
    waiting = book.waiting = book.waiting + delta
    cls = ticket.cls
    depth = engine._depth_by_cls[cls] = engine._depth_by_cls.get(cls, 0) + delta
    if engine._tracks_backlogs:  # when a tenant's and a class's queue last became non-empty (prediction)
        if waiting == 0:  # a backlog measured for a window goes on through a break shorter than one
            since_ms = book.since_ms
            measured = since_ms is not None and since_ms <= engine._clock_ms - adm.WINDOW_MS
            book.since_ms, book.idle_ms = (since_ms, engine._clock_ms) if measured else (None, None)
        elif waiting == delta:
            idle_ms = book.idle_ms
            if idle_ms is None or engine._clock_ms - idle_ms >= adm.WINDOW_MS:
                book.since_ms, book.base = engine._clock_ms, book.dispatched
            book.idle_ms = None
        if depth == 0:
            engine._backlog_since.pop(cls, None)
            engine._backlog_service.pop(cls, None)
        elif depth == delta:
            engine._backlog_since[cls], engine._backlog_base[cls] = engine._clock_ms, book.tallies[0].dispatched


def unqueue(engine: Scheduler, ticket: Ticket) -> None:
    """Take a waiting ticket out of every index (lazily where heaps hold it)."""
    if ticket.promoted:
        engine._promoted -= 1
    lane = ticket.lane
    assert lane is not None, "a waiting ticket is in a lane"
    lane.detach(ticket)
    ticket.promoted = False
    count_queued(engine, ticket, -1)
    if len(engine._deadlines) > 2 * engine._waiting + DEADLINE_SLACK:
        compact_deadlines(engine)
    if len(lane.age) > 2 * lane.live + AGE_SLACK:
        compact_age(lane)
    if engine._rescue_ms:
        engine.order.rescue_compact(lane)


def compact_deadlines(engine: Scheduler) -> None:
    """Drop the deadline heap's entries of tickets no longer waiting (left lazily when they were
    dispatched or cancelled; with long SLAs they never reach the top). In place: `expire` may be
    popping this very list. The live entries keep their total order, so nothing else changes."""
    heap = engine._deadlines
    heap[:] = [entry for entry in heap if entry[2].state == WAITING and entry[2].deadline_ms == entry[0]]
    heapify(heap)


def compact_age(lane: Lane) -> None:
    """Drop the lane's age-heap entries of requests that left it (left lazily: only the top is
    checked, so while one request waits long, the entries of every request dispatched after it
    stayed, as many as the lane dispatched meanwhile, each holding its finished ticket — in the
    shared dispatcher's snapshot too). In place, like the deadlines. The entries left are those
    the lazy checks would accept, one per request (a request put back by a 429 may have two,
    alike): their order is total, so the top, and every decision, stay the same."""
    seen: set[str] = set()
    live: list[tuple[int, str, Ticket]] = []
    for entry in lane.age:
        ticket = entry[2]
        if ticket.state == WAITING and ticket.lane is lane and not ticket.promoted and entry[1] not in seen:
            seen.add(entry[1])
            live.append(entry)
    lane.age[:] = live
    heapify(lane.age)
