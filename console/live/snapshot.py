"""What the console shows of the running dispatcher, read through its port and queue view on its
event loop (never from a thread: the engine is not locked). Tenant snapshots for the queue page,
counters for operations."""

from __future__ import annotations

import heapq
from collections import deque

from console.formatting import ended_because
from console.live.timeline import Sample, p95_ms
from gateway.api import REJECTS, UPSTREAM_ERRORS, Entry, SchedulerPort
from scheduling.engine.counters import WAIT_BUCKETS_MS

MAX_ROWS = 50  # rows of one tenant's table (nearest to service); counts per class cover all


def entry_view(d: SchedulerPort, entry: Entry, now_ms: int, holds=None) -> dict:
    """The queue API's view of one live request, with its waited time so far and held charge
    (``holds``: anything with ``get(public_id)``)."""
    row = d.live_view(entry, now_ms)
    row.pop("position_exact", None)
    row["estimated_charge"] = (holds or {}).get(entry.public_id)
    return row


def _order(d: SchedulerPort):
    """Running first, then waiting by class level and age: the ones nearest to service first
    (within one tenant and class, the engine serves in this order too)."""
    levels = {c.name: c.level for c in d.queue_view().classes()}
    return lambda e: (e.state != "running", levels.get(e.cls, 99), e.queued_since_ms)


def _shown(
    d: SchedulerPort, entries: list[Entry], *, offset: int = 0, limit: int = MAX_ROWS
) -> list[tuple[Entry, int]]:
    """One page of the tenant's requests in `_order`, each with its rank among the tenant's waiting
    requests of its class (0 for a running one): "3rd of yours"."""
    ordered = heapq.nsmallest(offset + limit, entries, key=_order(d))
    ranks: dict[str, int] = {}
    for entry in ordered[:offset]:  # counted only (no tuple per entry: a deep page stays cheap)
        if entry.state != "running":
            ranks[entry.cls] = ranks.get(entry.cls, 0) + 1
    out = []
    for entry in ordered[offset:]:
        rank = 0
        if entry.state != "running":
            rank = ranks[entry.cls] = ranks.get(entry.cls, 0) + 1
        out.append((entry, rank))
    return out


def tenant_queue(
    d: SchedulerPort, slug: str, now_ms: int, holds=None, *, offset: int = 0, limit: int = MAX_ROWS
) -> dict:
    entries = d.entries_of(slug)
    counts: dict[str, dict[str, int]] = {}
    for entry in entries:
        tally = counts.setdefault(entry.cls, {"queued": 0, "running": 0})
        tally["running" if entry.state == "running" else "queued"] += 1
    rows = []
    for entry, rank in _shown(d, entries, offset=offset, limit=limit):
        row = entry_view(d, entry, now_ms, holds)
        row["of_yours"] = rank if row["state"] != "running" else None
        rows.append(row)
    rows.sort(key=lambda r: (r["state"] != "running", r["position"] or 0))
    return {
        "total": len(entries),
        "counts": counts,
        "rows": rows,
        "offset": offset,
        "limit": limit,
        "truncated": len(entries) > offset + len(rows) or offset > 0,
    }


def queue_signature(queue: dict) -> tuple:
    """What makes a snapshot worth sending (waited time alone does not: the page counts it)."""
    return (
        queue["total"],
        tuple(sorted((c, v["queued"], v["running"]) for c, v in queue["counts"].items())),
        tuple(
            (
                r["id"],
                r["state"],
                r["class"],
                r["position"],
                r["of_yours"],
                r["eta_ms"],
                r.get("eta_upper_ms"),
                r.get("eta_confidence"),
                r.get("eta_slip_reason"),
                r["estimated_charge"],
            )
            for r in queue["rows"]
        ),
    )


def shown_ids(d: SchedulerPort, slug: str) -> list[str]:
    return [e.public_id for e, _ in _shown(d, d.entries_of(slug))]


def request_card(d: SchedulerPort | None, slug: str, public_id: str) -> dict | None:
    """One request of ``slug`` (live, or finished within the terminal log's hour); None if unknown."""
    if d is None:
        return None
    now_ms = d.now_ms()
    entry = d.entry_of(slug, public_id)
    if entry is not None:
        return entry_view(d, entry, now_ms)
    record = d.queue_view().ended(slug, public_id, now_ms=now_ms)
    if record is None:
        return None
    return {**record, "ended_because": ended_because(str(record["state"]))}  # why, in words


# --- operations ---------------------------------------------------------------------------


def _counter_samples(counter, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[sample.labels.get(label, "")] = out.get(sample.labels.get(label, ""), 0) + sample.value
    return out


def _backend_errors() -> dict[str, int]:
    out: dict[str, int] = {}
    for family in UPSTREAM_ERRORS.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                name = sample.labels.get("backend", "")
                out[name] = out.get(name, 0) + int(sample.value)
    return out


class OpsView:
    """Per-class and per-backend figures, with a minute of history for throughput."""

    def __init__(self) -> None:
        self._completed: deque[tuple[int, dict[str, int]]] = deque()

    def build(self, d: SchedulerPort, *, wall_ms: int) -> dict:
        now_ms = d.now_ms()
        view = d.queue_view()
        tallies = view.class_tallies()
        completed = {name: t.completed for name, t in tallies.items()}
        self._completed.append((wall_ms, completed))
        while len(self._completed) > 1 and wall_ms - self._completed[0][0] > 60_000:
            self._completed.popleft()
        then_ms, then = self._completed[0]
        minutes = max((wall_ms - then_ms) / 60_000, 1e-9)
        classes = []
        for spec in sorted(view.classes(), key=lambda c: c.level):
            tally = tallies.get(spec.name)
            classes.append(
                {
                    "class": spec.name,
                    "depth": view.depth(spec.name),
                    "depth_limit": view.depth_limit(spec.name, now_ms=now_ms),
                    "wait_p95_ms": p95_ms(tally.wait_hist, WAIT_BUCKETS_MS) if tally else None,
                    "throughput_per_min": None
                    if wall_ms == then_ms
                    else round((completed.get(spec.name, 0) - then.get(spec.name, 0)) / minutes, 1),
                    "rejected_queue_full": tally.rejected_queue_full if tally else 0,
                    "queue_timeout": tally.queue_timeout if tally else 0,
                    "boosted": tally.boosted if tally else 0,
                    "preempted": tally.preempted if tally else 0,
                }
            )
        errors = _backend_errors()
        backends = []
        for name, backend in sorted(view.backends().items()):
            health = view.backend_health(name)
            backends.append(
                {
                    "backend": name,
                    "enabled": backend.enabled,
                    "slots": backend.slots,
                    "in_use": health.in_use,
                    "tpm_used": health.tpm_used(now_ms),
                    "tpm": backend.tpm,
                    "errors": errors.get(name, 0),
                    "circuit_open": view.circuit_open_here(name, now_ms),
                }
            )
        rejects = {code: int(v) for code, v in sorted(_counter_samples(REJECTS, "code").items())}
        return {"classes": classes, "backends": backends, "rejects": rejects, "in_queue": view.waiting_count}


def timeline_sample(d: SchedulerPort, *, wall_ms: int, previous_hist: list[int] | None) -> tuple[Sample, list[int]]:
    """A timeline point; the top class's histogram is returned to diff against next time."""
    view = d.queue_view()
    tallies = view.class_tallies()
    classes = view.classes()
    top = min(classes, key=lambda c: c.level).name if classes else None
    hist = list(tallies[top].wait_hist) if top is not None and top in tallies else [0] * (len(WAIT_BUCKETS_MS) + 1)
    window = hist if previous_hist is None else [max(0, a - b) for a, b in zip(hist, previous_hist)]
    batch = tallies.get("BATCH")
    sample = Sample(
        at_ms=wall_ms,
        in_queue=view.waiting_count,
        interactive_p95_ms=p95_ms(window, WAIT_BUCKETS_MS),
        batch_completed=batch.completed if batch else 0,
        aging_preempts=sum(t.preempted for t in tallies.values()),
    )
    return sample, hist
