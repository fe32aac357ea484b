"""The engine's whole state as a versioned plain record, and an engine rebuilt from one.

The record carries everything a decision reads: the tickets (queued, running, and those the lazy
heaps and queues still name), the lanes with their tenant queues and heaps, the preempt, deadline
and rescue heaps, counters, rate windows and service means, backlog starts, the store's fair
counters and windows, the backends' busy slots and holds, headroom's forecast and holds, and
prediction's demand profile (optional: older records have none). What the configuration determines
(plans, aging curve, indexes) is recomputed from it. A restored engine makes the same decisions as
the one recorded. A record of another ``version`` is refused.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from . import admission as adm
from .capacity import BackendState
from .config_record import backend_from_record, config_from_record, from_plain, tenant_from_record, to_plain
from .counters import Tally
from .eta import EtaBook
from .fairness import Lane, TenantQueue
from .forecast import DemandProfile
from .model import ClassSpec, FairnessMode, Request, RequestId
from .queues import apply_config
from .scheduler import Scheduler
from .store import DONE, MemoryStore, Ticket, _Sample, _Window

SNAPSHOT_VERSION = 1
SCALARS = (  # the scheduler's own plain fields (numbers and dicts of numbers by class)
    "rescued",
    "_promote_due_ms",
    "_waiting",
    "_promoted",
    "_depth_by_cls",
    "_running_by_cls",
    "_started_sum",
    "_backlog_since",
    "_backlog_base",
    "_clock_ms",
    "_fast_fail_due_ms",
    "_next_seq",
    "_next_front",
)


class SnapshotVersionError(ValueError):
    """A record this version cannot read (another format: drain, then start; docs/operating.md)."""


def check_version(record: object, what: str = "engine snapshot") -> dict[str, Any]:
    if not isinstance(record, dict) or record.get("version") != SNAPSHOT_VERSION:
        found = record.get("version") if isinstance(record, dict) else type(record).__name__
        raise SnapshotVersionError(
            f"{what} of version {found!r} is not readable by this version (it reads version "
            f"{SNAPSHOT_VERSION}): drain the shared scheduler, then start (docs/operating.md)"
        )
    return record


class _Refs:
    """Tickets numbered as they are met, so that every heap, queue and lane names them by number."""

    def __init__(self) -> None:
        self.number: dict[int, int] = {}
        self.tickets: list[Ticket] = []

    def of(self, ticket: Ticket) -> int:
        number = self.number.get(id(ticket))
        if number is None:
            number = self.number[id(ticket)] = len(self.tickets)
            self.tickets.append(ticket)
        return number


def _mean_of(record: list[Any]) -> adm.ServiceMean:
    mean = adm.ServiceMean()
    mean.mean_ms, mean.samples, mean.var_ms2 = record
    return mean


def _lane_record(lane: Lane, refs: _Refs) -> dict[str, Any]:
    rank_at = next((k for k, entry in enumerate(lane.age) if entry is lane.rank_entry), None)
    return {
        "name": lane.name,
        "model": lane.model,
        "level": lane.level,
        "mode": lane.mode.value,
        "sla_ms": lane.sla_ms,
        "live": lane.live,
        "promoted": lane.promoted,
        "vt": lane.vt,
        "heap": [list(entry) for entry in lane.heap],
        "age": [[key_ms, rid, refs.of(ticket)] for key_ms, rid, ticket in lane.age],
        "rank": None if lane.rank is None else list(lane.rank),
        "rank_at": rank_at,
        "rank_valid_ms": list(lane.rank_valid_ms),
        "tenants": [
            {
                "key": tq.key,
                "items": [refs.of(ticket) for ticket in tq.items],
                "head_no": tq.head_no,
                "live": tq.live,
                "dead": tq.dead,
                "promoted": tq.promoted,
                "cost_sum": tq.cost_sum,
                "counter": tq.counter,
                "version": tq.version,
                "weight": tq.weight,
            }
            for tq in lane.tenants.values()
        ],
    }


def _ticket_record(ticket: Ticket, lanes: dict[int, int], stored: bool) -> dict[str, Any]:
    if ticket.state == DONE:  # ended, still named by a lazy index, which reads its state (and qseq) only
        return {"id": ticket.id, "qseq": ticket.qseq, "state": DONE}
    record = ticket.as_record()
    record.update(
        job=ticket.request.job,
        request_vip=ticket.request.vip,  # as the client sent it ("vip": the ticket's, with its tenant's)
        stored=stored,
        expires_ms=ticket.deadline_ms,
        promoted=ticket.promoted,
        tq_no=ticket.tq_no,
        lane=None if ticket.lane is None else lanes[id(ticket.lane)],
    )
    if ticket.eta_first is not None:  # optional: a record without it is read as before
        record["eta_first"] = list(ticket.eta_first)
    return record


def to_record(sched: Scheduler) -> dict[str, Any]:
    """``sched``'s state as plain data (its store must be the in-memory one)."""
    store = sched._store
    if not isinstance(store, MemoryStore):
        raise TypeError("only an engine on the in-memory store can be recorded")
    refs = _Refs()
    stored = [refs.of(ticket) for ticket in store._tickets.values()]
    lane_numbers = {id(lane): k for k, lane in enumerate(sched._lanes.values())}
    lanes = [_lane_record(lane, refs) for lane in sched._lanes.values()]
    preempt = {model: [[*entry[:4], refs.of(entry[4])] for entry in heap] for model, heap in sched._preempt.items()}
    deadlines = [[deadline_ms, rid, refs.of(ticket)] for deadline_ms, rid, ticket in sched._deadlines]
    rescue = [[*key, [[*entry[:3], refs.of(entry[3])] for entry in heap]] for key, heap in sched._rescue.items()]
    in_store = set(stored)
    capacity = sched._capacity
    return {
        "version": SNAPSHOT_VERSION,
        "config": to_plain(sched._config),
        "tenants": [to_plain(spec) for spec in sched._tenant_specs.values()],
        "retired": [to_plain(spec) for spec in sched._retired.values()],
        "backends": [
            [to_plain(state.spec), state.busy, state.hold_until_ms, state.enabled, state.removed]
            for state in capacity.states.values()
        ],
        "tickets": [_ticket_record(t, lane_numbers, k in in_store) for k, t in enumerate(refs.tickets)],
        "lanes": lanes,
        "preempt": preempt,
        "deadlines": deadlines,
        "rescue": rescue,
        "scalars": {name: getattr(sched, name) for name in SCALARS},
        "backlog_service": {cls: list(value) for cls, value in sched._backlog_service.items()},
        "backlog_done": {cls: list(value) for cls, value in sched._backlog_done.items()},
        "counters": {
            "classes": {name: tally.as_dict() for name, tally in sched.counters.classes.items()},
            "tenants": {name: tally.as_dict() for name, tally in sched.counters.tenants.items()},
        },
        "books": [[*key, b.waiting, b.dispatched, b.since_ms, b.base, b.idle_ms] for key, b in sched._books.items()],
        "cls_rate": {name: w.as_record() for name, w in sched._cls_rate.items()},
        "model_rate": {name: w.as_record() for name, w in sched._model_rate.items()},
        "cls_service": {name: [m.mean_ms, m.samples, m.var_ms2] for name, m in sched._cls_service.items()},
        "model_service": {name: [m.mean_ms, m.samples, m.var_ms2] for name, m in sched._model_service.items()},
        "headroom": sched.headroom.as_record(),
        "demand": None if sched.demand is None else sched.demand.as_record(),
        "eta_book": sched.eta_book.as_record(),
        "store": {
            "fair": [[*key, value] for key, value in store._fair.items()],
            "windows": {
                key: [[[s.at_ms, s.amount, s.handle, s.first_ms, s.count] for s in w.samples], w.total, w.requests]
                for key, w in store._windows.items()
            },
            "next_handle": store._next_handle,
        },
    }


def _ticket_of(record: dict[str, Any]) -> Ticket:
    if record["state"] == DONE:
        ended = Ticket(Request(RequestId(record["id"]), "", "", "", 0, 0, 0), record["qseq"], False)
        ended.state = DONE
        return ended
    request = Request(
        RequestId(record["id"]),
        record["tenant"],
        record["cls"],
        record["model"],
        record["prompt_tokens"],
        record["expected_output_tokens"],
        record["enqueued_ms"],
        record["deadline_ms"],
        record["request_vip"],
        record["job"],
    )
    ticket = Ticket(request, record["qseq"], record["vip"])
    ticket.state = record["state"]
    ticket.backend = record["backend"]
    ticket.dispatched_ms = record["dispatched_ms"]
    ticket.charge = record["charge"]
    charge_lane = record["charge_lane"]
    ticket.charge_lane = None if charge_lane is None else (charge_lane[0], charge_lane[1])
    ticket.charge_by_tokens = record["charge_by_tokens"]
    ticket.window_handle = record["window_handle"]
    ticket.deadline_ms = record["expires_ms"]
    ticket.promoted = record["promoted"]
    ticket.tq_no = record["tq_no"]
    first = record.get("eta_first")
    ticket.eta_first = None if first is None else (first[0], first[1], first[2], first[3], first[4], first[5])
    return ticket


def _store_of(record: dict[str, Any], tickets: list[Ticket], stored: list[bool]) -> MemoryStore:
    store = MemoryStore()
    for ticket, kept in zip(tickets, stored, strict=True):
        if kept:
            store._tickets[ticket.id] = ticket
    store._fair = {(cls, model, tenant): value for cls, model, tenant, value in record["fair"]}
    for key, (samples, total, requests) in record["windows"].items():
        window = store._windows[key] = _Window()
        for at_ms, amount, handle, first_ms, count in samples:
            sample = _Sample(at_ms, amount, handle)
            sample.first_ms, sample.count = first_ms, count
            window.samples.append(sample)
            window.by_handle[handle] = sample
        window.total, window.requests = total, requests
    store._next_handle = record["next_handle"]
    return store


def _lane_of(sched: Scheduler, record: dict[str, Any], tickets: list[Ticket]) -> Lane:
    mode = FairnessMode(record["mode"])
    lane = Lane(
        record["name"],
        record["model"],
        record["level"],
        mode,
        sched._tenant_weight,
        sched._unknown_weight,
        sched._store,
    )
    lane.sla_ms, lane.live, lane.promoted, lane.vt = record["sla_ms"], record["live"], record["promoted"], record["vt"]
    lane.heap = [tuple(entry) for entry in record["heap"]]
    lane.age = [(key_ms, rid, tickets[number]) for key_ms, rid, number in record["age"]]
    lane.rank = None if record["rank"] is None else tuple(record["rank"])
    lane.rank_entry = None if record["rank_at"] is None else lane.age[record["rank_at"]]
    lane.rank_valid_ms = tuple(record["rank_valid_ms"])
    for tq_record in record["tenants"]:
        key = tq_record["key"]
        tq = TenantQueue(key, (lane.name, lane.model, key), tq_record["counter"], tq_record["weight"])
        tq.items = deque(tickets[number] for number in tq_record["items"])
        tq.head_no, tq.live, tq.dead = tq_record["head_no"], tq_record["live"], tq_record["dead"]
        tq.promoted, tq.cost_sum, tq.version = tq_record["promoted"], tq_record["cost_sum"], tq_record["version"]
        lane.tenants[key] = tq
    return lane


def from_record(record: object) -> Scheduler:
    """A new engine in the state ``record`` (from `to_record`) holds; SnapshotVersionError if it is
    of another version."""
    record = check_version(record)
    config = config_from_record(record["config"])
    tickets = [_ticket_of(t) for t in record["tickets"]]
    store = _store_of(record["store"], tickets, [t.get("stored", False) for t in record["tickets"]])
    sched = Scheduler(config, tenants=map(tenant_from_record, record["tenants"]), backends=())
    sched._store = sched._capacity._store = store  # after the start-up rebuild, which saw no tickets
    for name, value in record["scalars"].items():
        setattr(sched, name, value)
    sched._backlog_service = {cls: (v[0], v[1]) for cls, v in record["backlog_service"].items()}
    sched._backlog_done = {cls: (v[0], v[1], v[2]) for cls, v in record["backlog_done"].items()}
    counters = sched.counters
    counters.classes = {name: Tally(**tally) for name, tally in record["counters"]["classes"].items()}
    counters.tenants = {name: Tally(**tally) for name, tally in record["counters"]["tenants"].items()}
    sched._books = {}
    for cls, tenant, waiting, dispatched, since_ms, base, *idle in record["books"]:  # idle_ms: optional (older)
        book = sched._book(cls, tenant)
        book.waiting, book.dispatched, book.since_ms, book.base = waiting, dispatched, since_ms, base
        book.idle_ms = idle[0] if idle else None
    sched._cls_rate = {name: adm.RateWindow.from_record(w) for name, w in record["cls_rate"].items()}
    sched._model_rate = {name: adm.RateWindow.from_record(w) for name, w in record["model_rate"].items()}
    sched._cls_service = {name: _mean_of(m) for name, m in record["cls_service"].items()}
    sched._model_service = {name: _mean_of(m) for name, m in record["model_service"].items()}
    sched._retired = {spec["name"]: from_plain(ClassSpec, spec) for spec in record["retired"]}
    apply_config(sched, config)  # plans and rate references over the restored windows
    capacity = sched._capacity
    capacity.states = {}
    for spec, busy, hold_until_ms, enabled, removed in record["backends"]:
        state = BackendState(backend_from_record(spec), busy, hold_until_ms)
        state.enabled, state.removed = enabled, removed
        capacity.states[state.name] = state
    capacity._index()
    sched.headroom.restore(record["headroom"])
    demand = record.get("demand")  # optional: older records have none
    if demand is not None and sched.demand is not None:
        restored = DemandProfile.from_record(demand)
        if restored.compatible(bucket_ms=sched.demand.bucket_ms, alpha=sched.demand.alpha):
            sched.demand = restored
    sched.eta_book = EtaBook.from_record(record.get("eta_book"))  # optional: older records have none
    _restore_indexes(sched, record, tickets)
    return sched


def _restore_indexes(sched: Scheduler, record: dict[str, Any], tickets: list[Ticket]) -> None:
    sched._lanes, sched._lane_list, sched._class_lanes = {}, [], {}
    for lane_record in record["lanes"]:
        lane = _lane_of(sched, lane_record, tickets)
        sched._lanes[lane.key] = lane
        sched._lane_list.append(lane)
        sched._class_lanes.setdefault(lane.name, []).append(lane)
    sched._lane_list.sort(key=lambda ln: (ln.level, ln.name, ln.model))
    lanes = list(sched._lanes.values())
    for ticket, ticket_record in zip(tickets, record["tickets"], strict=True):
        if ticket.state == DONE:
            continue
        ticket.book = sched._book(ticket.cls, ticket.tenant)
        if ticket_record["lane"] is not None:
            lane = ticket.lane = lanes[ticket_record["lane"]]
            ticket.tq = lane.tenants["" if lane.fifo else ticket.tenant]
    sched._preempt = {
        model: [(d, level, enq, rid, tickets[n]) for d, level, enq, rid, n in heap]
        for model, heap in record["preempt"].items()
    }
    sched._deadlines = [(d, rid, tickets[n]) for d, rid, n in record["deadlines"]]
    sched._rescue = {
        (cls, model): [(d, enq, rid, tickets[n]) for d, enq, rid, n in heap] for cls, model, heap in record["rescue"]
    }
