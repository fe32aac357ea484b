"""A member's HTTP requests as jobs: those a client tags with one ``X-Job-Id`` (untagged: those of
one API key and class, ``gateway.lifecycle.job_of``) are one card with progress (done, failed,
waiting, running), the ETA to its last request, its charges so far and an estimated total.

Two halves: `job_tallies` reads the dispatcher on its event loop (live requests through every
process; finished ones from this process's terminal log, an hour of them), `job_cards` adds the
money from the ledger in a thread (each finished request's charge is read once, then memoised).
A batch's lines are its batch's card (batches.service.batch_cards), never also an untagged job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from itertools import zip_longest

from batches.service import batch_of_line
from billing.models import LedgerEntry
from billing.money import ZERO, money
from console.formatting import ended_because
from gateway.api import UNTAGGED_JOB, Entry, Outcome, State

SAMPLE_HOLDS = 200  # live requests whose holds price a job's remainder before any of it has ended
MEMO_MAX = 200_000
FAILURES_SHOWN = 10  # a card lists its latest failures, each a link to its request
ETA_FIELDS = ("eta_upper_ms", "eta_confidence", "eta_slip_reason", "eta_first_at_ms")


def _batch_line(job: str | None, public_id: str) -> bool:
    """A batch's line: untagged (gateway.lifecycle.job_of), with a line's id (batches.service)."""
    return job is not None and job.startswith(UNTAGGED_JOB) and batch_of_line(public_id) is not None


@dataclass
class JobTally:
    job: str
    classes: set[str] = field(default_factory=set)
    done_ids: list[str] = field(default_factory=list)
    failed_ids: list[str] = field(default_factory=list)  # ended otherwise (a stream cut short is charged too)
    failed_reasons: list[str] = field(default_factory=list)  # the outcome of each of failed_ids, same order
    waiting: int = 0
    running: int = 0
    live_ids: list[str] = field(default_factory=list)
    last_waiting: Entry | None = None  # the live request its job will see served last
    eta_ms: int | None = None
    eta: dict = field(default_factory=dict)  # eta_upper_ms, eta_confidence, eta_slip_reason, eta_first_at_ms

    @property
    def failed(self) -> int:
        return len(self.failed_ids)

    @property
    def total(self) -> int:
        return len(self.done_ids) + self.failed + self.waiting + self.running


def _count_live(d, slug: str, tallies: dict[str, JobTally], levels: dict[str, int]) -> None:
    """Live requests by job, in a few passes of comprehensions (a tenant may have 12,000 waiting)."""
    by_job: dict[str, list] = {}
    for entry in d.entries_of(slug):
        if entry.job and not _batch_line(entry.job, entry.public_id):
            by_job.setdefault(entry.job, []).append(entry)
    for job, entries in by_job.items():
        tally = tallies.setdefault(job, JobTally(job))
        waiting = [e for e in entries if e.state != State.RUNNING]
        tally.waiting, tally.running = len(waiting), len(entries) - len(waiting)
        tally.classes.update({e.cls for e in entries})
        tally.live_ids = [e.public_id for e in entries[:SAMPLE_HOLDS]]
        if waiting:  # served last: the lowest class, the newest in it
            tally.last_waiting = max(reversed(waiting), key=lambda e: (levels.get(e.cls, 99), e.queued_since_ms))


def job_tallies(d, slug: str, now_ms: int) -> dict[str, JobTally]:
    """Per job of ``slug``: its live and finished requests (read on the dispatcher's loop)."""
    view = d.queue_view()
    levels = {c.name: c.level for c in view.classes()}
    tallies: dict[str, JobTally] = {}
    _count_live(d, slug, tallies, levels)
    for job, records in view.ended_jobs(slug, now_ms=now_ms).items():
        records = [r for r in records if not _batch_line(job, r["id"])]
        if not records:
            continue
        tally = tallies.setdefault(job, JobTally(job))
        for record in records:
            tally.classes.add(record["class"])
            if record["state"] == Outcome.COMPLETED:
                tally.done_ids.append(record["id"])
            else:
                tally.failed_ids.append(record["id"])
                tally.failed_reasons.append(str(record["state"]))
    for tally in tallies.values():
        if tally.last_waiting is not None:  # the job's ETA: its last request's, with the same fields
            row = d.live_view(tally.last_waiting, now_ms)
            tally.eta_ms = row["eta_ms"]
            tally.eta = {key: row.get(key) for key in ETA_FIELDS}
        elif tally.running:
            tally.eta_ms = 0
            tally.eta = {"eta_upper_ms": 0}
    return tallies


def batch_forecasts(d, slug: str, now_ms: int) -> dict[str, dict]:
    """Per batch of ``slug`` with lines waiting in the engine: the engine's ETA fields of its line
    served last (as for a job), so that a batch card never shows a figure the engine cannot stand by."""
    levels = {c.name: c.level for c in d.queue_view().classes()}
    last: dict[str, tuple[tuple[int, int], Entry]] = {}
    for entry in d.entries_of(slug):
        batch = batch_of_line(entry.public_id) if entry.state != State.RUNNING else None
        if batch is None:
            continue
        order = (levels.get(entry.cls, 99), entry.queued_since_ms)
        if batch not in last or order >= last[batch][0]:  # a tie: the later admitted is served later
            last[batch] = (order, entry)
    out = {}
    for batch, (_, entry) in last.items():
        row = d.live_view(entry, now_ms)
        out[batch] = {"eta_ms": row["eta_ms"], **{key: row.get(key) for key in ETA_FIELDS}}
    return out


def job_label(job: str) -> tuple[str, bool]:
    """(what the card is called, whether the client tagged it)."""
    if job.startswith(UNTAGGED_JOB):
        prefix, _, cls = job.removeprefix(UNTAGGED_JOB).partition("/")
        return f"Untagged · key {prefix}… · {cls}", False
    return job, True


class JobMoney:
    """Charges of finished requests (memoised: a charge never changes) and holds of live ones."""

    def __init__(self) -> None:
        self.charges: dict[str, Decimal] = {}  # ledger request id -> charged amount

    def charged(self, *, tenant_id: int, slug: str, public_ids: list[str]) -> Decimal:
        ids = [f"{slug}/{public_id}" for public_id in public_ids]
        missing = [i for i in ids if i not in self.charges]
        if missing:
            if len(self.charges) > MEMO_MAX:
                self.charges.clear()
            rows = LedgerEntry.objects.of_requests(missing).filter(tenant_id=tenant_id)
            for request_id, kind, amount in rows.values_list("request_id", "kind", "amount"):
                if kind == LedgerEntry.Kind.CHARGE:
                    self.charges[request_id] = amount
        return sum((self.charges.get(i, ZERO) for i in ids), ZERO)

    @staticmethod
    def mean_hold(*, tenant_id: int, slug: str, public_ids: list[str]) -> Decimal | None:
        ids = [f"{slug}/{public_id}" for public_id in public_ids[:SAMPLE_HOLDS]]
        rows = LedgerEntry.objects.of_requests(ids).filter(tenant_id=tenant_id)
        amounts = [amount for kind, amount in rows.values_list("kind", "amount") if kind == LedgerEntry.Kind.HOLD]
        return sum(amounts, ZERO) / len(amounts) if amounts else None


def _estimate(tally: JobTally, charged: Decimal, mean_hold: Decimal | None) -> tuple[Decimal | None, str | None]:
    remaining = tally.waiting + tally.running
    if not remaining:
        return charged, "charged"
    if tally.done_ids:
        return money(charged + charged / (len(tally.done_ids) + tally.failed) * remaining), "mean so far"
    if mean_hold is not None:
        return money(mean_hold * remaining), "holds (at most)"
    return None, None


def failures_of(tally: JobTally) -> tuple[list[dict], list[dict]]:
    """(why its requests failed, by reason, most first; its latest failures, each with its reason)."""
    counts: dict[str, int] = {}
    for reason in tally.failed_reasons:
        counts[reason] = counts.get(reason, 0) + 1
    by_reason = [
        {"reason": r, "because": ended_because(r), "count": n}
        for r, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]
    latest = list(zip_longest(tally.failed_ids, tally.failed_reasons, fillvalue=""))[-FAILURES_SHOWN:][::-1]
    return by_reason, [{"id": i, "reason": r, "because": ended_because(r)} for i, r in latest]


def job_cards(tallies: dict[str, JobTally], *, tenant_id: int, slug: str, memo: JobMoney) -> list[dict]:
    """The cards, active jobs first (in a thread: reads the ledger)."""
    cards = []
    for tally in tallies.values():
        charged = memo.charged(tenant_id=tenant_id, slug=slug, public_ids=tally.done_ids + tally.failed_ids)
        mean_hold = None
        if not tally.done_ids and tally.live_ids:
            mean_hold = memo.mean_hold(tenant_id=tenant_id, slug=slug, public_ids=tally.live_ids)
        estimate, basis = _estimate(tally, charged, mean_hold)
        label, tagged = job_label(tally.job)
        by_reason, failures = failures_of(tally)
        cards.append(
            {
                "job": tally.job,
                "label": label,
                "tagged": tagged,
                "classes": sorted(tally.classes),
                "total": tally.total,
                "done": len(tally.done_ids),
                "failed": tally.failed,
                "failed_by_reason": by_reason,
                "failures": failures,
                "waiting": tally.waiting,
                "running": tally.running,
                "eta_ms": tally.eta_ms,
                **{key: tally.eta.get(key) for key in ETA_FIELDS},
                "charged": str(charged),
                "estimated_total": None if estimate is None else str(estimate),
                "estimate_basis": basis,
            }
        )
    cards.sort(key=lambda c: (not (c["waiting"] or c["running"]), not c["tagged"], c["label"]))
    return cards


def waits_by_minute(d, slug: str, now_ms: int) -> list[dict]:
    """The tenant's finished requests of the last hour (this process's terminal log), by minute
    of their end and class: how many, their mean and their longest wait in the queue."""
    cells: dict[tuple[str, str], list[int]] = {}
    for records in d.queue_view().ended_jobs(slug, now_ms=now_ms).values():
        for record in records:
            minute = str(record.get("finished_at", ""))[:16]
            cells.setdefault((minute, record["class"]), []).append(int(record.get("waited_ms") or 0))
    return [
        {
            "minute": minute,
            "class": cls,
            "requests": len(waits),
            "mean_wait_ms": sum(waits) // len(waits),
            "max_wait_ms": max(waits),
        }
        for (minute, cls), waits in sorted(cells.items())
    ]
