"""From what the replay observed to the field report's timeline table and the headline figures.

``interactive_p95`` of a row is the 95th percentile of chat time-to-first-token, in simulated
seconds, over the chat requests *sent* in the step that ends at the row's time (5 simulated
minutes). A user who gave up counts with their patience as a lower bound: a p95 that falls on
such a value is shown as ``>N s``. Chat requests refused by the gateway (429/504, fast) are not
latencies: they are counted in ``chat_refused``.

A run whose batch was uploaded (bench.surge.upload) has no client-side batch requests: its batch
figures are the batch's own (``BatchTally``), and its table shows ``batch_pending`` (lines still
in the batch, not yet in an engine) instead of ``batch_not_sent``.

A run with no batch at all (``no_batch``) replays the same chat and near-RT traffic only; its
p95 from 09:00 is the baseline the other runs' windows are divided by (``vs_no_batch``), so a
window's ratio says how much the batch slowed the chats sent in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.surge.plan import FIELD_P95_S, REPORT_TIMES, SurgePlan
from bench.surge.probe import GatewayView
from bench.surge.traffic import ERROR, GAVE_UP, OK, Ledger, Outcome

COLUMNS = (
    "time",
    "in_queue",
    "interactive_p95",
    "field_p95",
    "batch_completed",
    "aging_preempt",
    "chat_gave_up",
    "chat_refused",
    "batch_not_sent",
    "client_lag",
    "machine_stalls",
)
UPLOAD_COLUMNS = (
    "time",
    "in_queue",
    "batch_pending",
    "interactive_p95",
    "field_p95",
    "batch_completed",
    "aging_preempt",
    "chat_gave_up",
    "chat_refused",
    "client_lag",
    "machine_stalls",
)
NO_BATCH_COLUMNS = ("time", "interactive_p95", "chat_gave_up", "chat_refused", "client_lag", "machine_stalls")
VS_BASELINE = "vs_no_batch"  # the column of a window's p95 over the no-batch run's


@dataclass(frozen=True)
class Sample:
    sim_s: float  # since the replay started
    clock: str
    view: GatewayView | None
    batch_completed: int
    batch_failed: int
    batch_not_sent: int


@dataclass(frozen=True)
class P95:
    value_s: float | None
    censored: bool = False
    samples: int = 0

    def text(self) -> str:
        if self.value_s is None:
            return "–"
        return f"{'>' if self.censored else ''}{self.value_s:.2f}s"


@dataclass(frozen=True)
class BatchTally:
    """How an uploaded batch ended, as the gateway reports it (its status, its counts, and its
    failed lines by error code from its error file)."""

    status: str
    completed: int
    failed: int
    codes: dict[str, int] = field(default_factory=dict)


def p95_of(outcomes: list[Outcome]) -> P95:
    """Nearest-rank p95 over answered and given-up chats (given-up ones as lower bounds)."""
    values = sorted(
        (o.ttft_sim_s, o.state == GAVE_UP) for o in outcomes if o.state in (OK, GAVE_UP) and o.ttft_sim_s is not None
    )
    if not values:
        return P95(None)
    rank = max(0, min(len(values) - 1, -(-95 * len(values) // 100) - 1))
    value, censored = values[rank]
    return P95(value, censored, len(values))


@dataclass
class SurgeResult:
    plan: SurgePlan
    samples: list[Sample]
    ledger: Ledger
    drained_sim_s: float | None  # last batch answer, since 09:00 (None: not all answered)
    ended_sim_s: float
    notes: list[str] = field(default_factory=list)
    batch: BatchTally | None = None  # an uploaded batch's end (None: sent over HTTP, or never created)
    uploaded: bool = False  # the batch went through the Batch API, not as HTTP requests
    no_batch: bool = False  # the same chat and near-RT traffic with no batch at all (the baseline run)
    baseline: P95 | None = None  # the no-batch run's p95 from 09:00, when the comparison had one
    # (simulated s since the replay started, real ms late): the replay's own event loop woke up late
    # (bench.surge.replay.LAG_MS or more: a chat's time to first token counts the client's delay too)
    # and the machine stalled (bench.canary: every process at once)
    client_lags: list[tuple[float, float]] = field(default_factory=list)
    stalls: list[tuple[float, float]] = field(default_factory=list)

    @property
    def columns(self) -> tuple[str, ...]:
        columns = NO_BATCH_COLUMNS if self.no_batch else UPLOAD_COLUMNS if self.uploaded else COLUMNS
        return columns + (VS_BASELINE,) if self.baseline is not None else columns

    def chats_sent_in(self, start_sim_s: float, end_sim_s: float) -> list[Outcome]:
        return [o for o in self.ledger.of("chat") if start_sim_s < o.sent_sim_s <= end_sim_s]

    def row(self, sample: Sample) -> dict[str, str]:
        chats = self.chats_sent_in(sample.sim_s - self.plan.step_sim_s, sample.sim_s)
        view = sample.view
        p95 = p95_of(chats)
        return {
            "time": sample.clock,
            "in_queue": "?" if view is None else f"{view.batch_waiting:,}",
            "interactive_p95": p95.text(),
            "field_p95": f"{FIELD_P95_S[sample.clock]:.2f}s" if sample.clock in FIELD_P95_S else "",
            "batch_completed": f"{sample.batch_completed:,}",
            "aging_preempt": "?" if view is None else f"{view.aging_preempts:,}",
            "chat_gave_up": str(sum(o.state == GAVE_UP for o in chats)),
            "chat_refused": str(sum(o.state == ERROR for o in chats)),
            "batch_not_sent": f"{sample.batch_not_sent:,}",
            "batch_pending": _pending(view),
            VS_BASELINE: ratio_text(p95, self.baseline) if self.baseline is not None else "",
            "client_lag": _longest(self.client_lags, sample.sim_s - self.plan.step_sim_s, sample.sim_s, "<5 ms"),
            "machine_stalls": _longest(self.stalls, sample.sim_s - self.plan.step_sim_s, sample.sim_s, "0"),
        }

    def rows(self, every_step: bool = False) -> list[dict[str, str]]:
        """The field report's times, the peak window (wherever it fell) and the last sample."""
        wanted = set(REPORT_TIMES)
        peak_at, _ = self.peak_window()
        chosen = [s for s in self.samples if every_step or s.clock in wanted or s is peak_at]
        if self.samples and self.samples[-1] not in chosen:
            chosen.append(self.samples[-1])
        return [self.row(s) for s in chosen]

    def surge_chats(self) -> list[Outcome]:
        end = self.plan.warmup_sim_s + (self.drained_sim_s or self.ended_sim_s)
        return self.chats_sent_in(self.plan.warmup_sim_s, end)

    def peak_window(self) -> tuple[Sample | None, P95]:
        """The worst 5-minute window after 09:00 (of those with 5 chats or more): the sample that
        ends it and its interactive p95."""
        plan = self.plan
        windows = [  # by the time it was due (a late sample of 09:00 is still the window before the batch)
            (s, p95_of(self.chats_sent_in(s.sim_s - plan.step_sim_s, s.sim_s)))
            for s in self.samples
            if plan.since_start(s.clock) > plan.warmup_sim_s
        ]
        windows = [(s, w) for s, w in windows if w.value_s is not None and w.samples >= 5]
        if not windows:
            return None, P95(None)
        return max(windows, key=lambda sw: (sw[1].value_s or 0.0, sw[1].censored))

    def peak_and_whole(self) -> tuple[P95, P95]:
        """Interactive p95 of the worst 5-minute window after 09:00 and of the whole surge."""
        return self.peak_window()[1], p95_of(self.surge_chats())

    def headline(self) -> dict[str, str]:
        plan = self.plan
        peak_at, peak = self.peak_window()
        whole = p95_of(self.surge_chats())
        chats = self.surge_chats()
        near = [o for o in self.ledger.of("near_rt") if o.sent_sim_s > plan.warmup_sim_s]
        base = self.baseline
        return {
            "interactive p95, peak 5-min window": peak.text() + (f" (to {peak_at.clock})" if peak_at else ""),
            "interactive p95, whole surge": whole.text(),
            "peak window p95 / whole surge p95": ratio_text(peak, whole),
            "peak window p95 / no-batch p95": ratio_text(peak, base) if base is not None else "–",
            "whole surge p95 / no-batch p95": ratio_text(whole, base) if base is not None else "–",
            "chat users who gave up (surge)": _share(sum(o.state == GAVE_UP for o in chats), len(chats)),
            "chat refused by the gateway (surge)": _share(sum(o.state == ERROR for o in chats), len(chats))
            + _codes_suffix([o for o in chats if o.state == ERROR]),
            "near-RT p95 (whole response)": p95_of([o for o in near if o.state == OK]).text(),
            **self._batch_figures(),
            "time to drain (from 09:00)": "–" if self.no_batch else _duration(self.drained_sim_s),
            "aging preempts": _last_preempts(self.samples),
        }

    def _batch_figures(self) -> dict[str, str]:
        total = self.plan.batch_count
        if self.no_batch:
            return {"batch completed": "– (no batch)", "batch failed": "–"}
        if not self.uploaded:
            batch = self.ledger.of("batch")
            return {
                "batch completed": _share(sum(o.state == OK for o in batch), total),
                "batch failed": _codes([o for o in batch if o.state == ERROR]),
            }
        tally = self.batch
        if tally is None:
            return {"batch completed": "not created", "batch failed": "–"}
        failed = ", ".join(f"{code} {n:,}" for code, n in sorted(tally.codes.items())) or f"{tally.failed:,}"
        return {"batch completed": _share(tally.completed, total), "batch failed": failed}


def ratio(peak: P95, whole: P95) -> float | None:
    """The peak window's p95 over the whole surge's (None when either is unknown)."""
    if peak.value_s is None or whole.value_s is None or whole.value_s <= 0:
        return None
    return peak.value_s / whole.value_s


def ratio_text(peak: P95, whole: P95) -> str:
    """``ratio`` as ``N.NNx``: ``>`` when only the peak is a lower bound (the ratio is at least
    that), ``<`` when only the whole is, and said so when both are (then it bounds nothing)."""
    value = ratio(peak, whole)
    if value is None:
        return "–"
    if peak.censored and whole.censored:
        return f"{value:.2f}x (both lower bounds)"
    return f"{'>' if peak.censored else '<' if whole.censored else ''}{value:.2f}x"


def _longest(lates: list[tuple[float, float]], start_sim_s: float, end_sim_s: float, none: str) -> str:
    """How many of ``lates`` fell in the window and the longest (real ms), or ``none``."""
    within = [ms for at, ms in lates if start_sim_s < at <= end_sim_s]
    if not within:
        return none
    return f"{max(within):.0f} ms" if len(within) == 1 else f"{len(within)}, longest {max(within):.0f} ms"


def _pending(view: GatewayView | None) -> str:
    """Batch API lines still in their batch (not yet in an engine), as /metrics counted them."""
    if view is None or "pending" not in view.batch_lines:
        return "?"
    return f"{view.batch_lines['pending']:,}"


def _share(count: int, total: int) -> str:
    return f"{count:,} of {total:,} ({100.0 * count / total:.1f}%)" if total else "0"


def _codes(failed: list[Outcome]) -> str:
    if not failed:
        return "0"
    by_code: dict[str, int] = {}
    for outcome in failed:
        by_code[outcome.code] = by_code.get(outcome.code, 0) + 1
    return ", ".join(f"{code} {count:,}" for code, count in sorted(by_code.items()))


def _codes_suffix(failed: list[Outcome]) -> str:
    return f": {_codes(failed)}" if failed else ""


def _duration(sim_s: float | None) -> str:
    if sim_s is None:
        return "not drained"
    minutes = round(sim_s / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _last_preempts(samples: list[Sample]) -> str:
    for sample in reversed(samples):
        if sample.view is not None:
            return f"{sample.view.aging_preempts:,}"
    return "?"


def markdown_table(rows: list[dict[str, str]], columns: tuple[str, ...] = COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def headline_table(results: dict[str, SurgeResult]) -> str:
    """Headline figures side by side, one column per policy."""
    names = list(results)
    heads = {name: result.headline() for name, result in results.items()}
    first = heads[names[0]]
    lines = ["| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += ["| " + label + " | " + " | ".join(heads[n][label] for n in names) + " |" for label in first]
    return "\n".join(lines)
