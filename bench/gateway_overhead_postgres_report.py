"""The report of bench.gateway_overhead's PostgreSQL mode (bench/REPORT-gateway-postgres.md): the
tables of what each gateway's processes used and where the billing worker's connection waited,
from the measurements of bench.gateway_overhead_postgres. Nothing here imports Django."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from statistics import mean

from bench.canary import STALL_MS
from bench.gateway_overhead_postgres import SAMPLE_INTERVAL_MS, Usage
from bench.gateway_overhead_results import BILLING_RATIO_TARGET, SUSTAINED_TARGET, step_table
from bench.report_gateway import section_write

REPORT_PATH = Path(__file__).resolve().parent / "REPORT-gateway-postgres.md"


WAIT_COLUMNS = ("idle", "idle in transaction", "active, running")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return mean(values) if values else None


def wait_shares(waits: dict[str, dict[str, int]], label: str = "billing worker") -> dict[str, float]:
    """state -> share of the samples the backend(s) of ``label`` spent in it."""
    mine = waits.get(label, {})
    total = sum(mine.values())
    return {state: n / total for state, n in mine.items()} if total else {}


def _merge_waits(runs) -> dict[str, float]:
    merged: Counter = Counter()
    for run in runs:
        merged.update(run.waits.get("billing worker", {}))
    total = sum(merged.values())
    return {state: n / total for state, n in merged.items()} if total else {}


def _busy(busy: float | None, waited: float | None) -> str:
    return _pct(busy) + ("" if waited is None else f" ({_pct(waited)})")


def usage_columns(usage: Usage | None) -> str:
    if usage is None:
        return "– | – | – | – | – | – | –"
    return (
        f"{_busy(usage.gateway_busy, usage.gateway_cpu_wait)} | {_busy(usage.worker_busy, usage.worker_cpu_wait)} | "
        f"{_busy(usage.database_busy, usage.database_cpu_wait)} | "
        f"{usage.machine_busy:.2f} | {_num(usage.batches_per_s, 0)} | {_num(usage.asks_per_batch)} | "
        f"{_ms(usage.batch_ms)}"
    )


USAGE_HEADER = (
    "gateway busy (waiting for a CPU) | billing worker busy (waiting) | its PostgreSQL backends busy "
    f"(waiting) | machine (cores of {os.cpu_count()}) | batches/s | asks per batch | "
    "batch round trip (mean)"
)


def render(found: dict) -> str:
    settings = found.get("postgres", {})
    load = found.get("load_avg")
    load_text = "" if not load else f" (1-minute load average {load[0]:.1f} before the run, {load[1]:.1f} after)"
    setting_text = ", ".join(f"`{k}` {v}" for k, v in settings.items())
    parts = [
        "## Gateway overhead on PostgreSQL (`python -m bench.gateway_overhead --database postgres`)",
        "",
        "One simulated backend answering after a fixed 50 ms; two gateways, each `manage.py serve` on a "
        "scratch PostgreSQL database of its own (created and dropped by the run; `DATABASE_URL`, in-memory "
        "channel layer), one with billing on, one with billing off (`FAIRGATE_BILLING=0`), measured "
        f"alternately in one run. PostgreSQL: {setting_text}. {os.cpu_count()} CPU cores shared by every "
        "process (gateways, billing worker, PostgreSQL, simulated backend, load generator, other work on "
        f"the machine){load_text}."
        + (
            f" The billing worker runs {found['worker_nice']} nicer than its gateway (`FAIRGATE_BILLING_WORKER_NICE`)."
            if found.get("worker_nice") is not None
            else ""
        )
        + (
            f" An answer's end waits for its settlement's journal line to be"
            f" {({'write': 'written', 'sync': 'written and synced'}).get(found['journal_wait'], found['journal_wait'])}"
            f" (`FAIRGATE_JOURNAL_WAIT={found['journal_wait']}`)."
            if found.get("journal_wait")
            else ""
        )
        + (f" Took {found['took_s'] / 60:.1f} min." if found.get("took_s") else ""),
        "",
        (
            "Planner statistics: each gateway first serves a 5-second closed loop of 64 connections (a "
            "production ledger is never empty), and every scratch database is ANALYZEd before each run, as "
            "autovacuum keeps a long-lived database's (with the statistics of an empty ledger the planner "
            "reads each batch's ledger entries with a sequential scan of the whole ledger: "
            "`--stale-statistics` measures that, without the warm-up)."
            if found.get("analyzed", True)
            else "Planner statistics: left to autovacuum (`--stale-statistics`): the ledger grows from empty "
            "during the run, and the planner may read each batch's ledger entries with a sequential scan "
            "of the whole ledger (see the ledger seq scans column)."
        ),
        "",
    ]

    for rate in dict.fromkeys(row["rate"] for row in found["pg_latency"]):
        parts += latency_section([row for row in found["pg_latency"] if row["rate"] == rate]) + [""]
    parts += saturation_section(found["saturation"], BILLING_RATIO_TARGET)
    if found.get("steps"):
        rates = found.get("rates")
        parts += [
            "",
            "### Highest sustained rate (added p99 < 50 ms, >= 99.9% answered, generator's send lag "
            f"p99 < 10 ms; steps {', '.join(map(str, rates))} requests/s)",
            "",
        ]
        for name, steps in found["steps"].items():
            lines, best = step_table(name, steps)
            shown = f"{best}/s" if best else f"below {rates[0]}/s"
            parts += lines + [
                "",
                f"- {name}: sustains {shown} (target >= {SUSTAINED_TARGET}/s: "
                f"{'yes' if best and best >= SUSTAINED_TARGET else '**no**'})",
                "",
            ]
    parts += [
        "",
        "### Columns",
        "",
        "- *gateway busy*: the share of one core the gateway's own process used (its event loop); "
        "*billing worker busy*: its child process that books the batches (billing.worker); "
        "*its PostgreSQL backends busy*: the server processes of its scratch database (both of its "
        "connections; a backend that ended during the run is not counted); *machine*: all cores busy, "
        "in cores, every process included. In brackets: the share of the run the process (its main thread; "
        "all backends summed) was runnable but waited for a CPU (/proc/<pid>/schedstat): time a process "
        "lost to the machine being busy, not to what it was waiting for.",
        "- *batch round trip*: from the Booker sending a batch to the worker to its answer being read by "
        "the event loop (`fairgate_billing_batch_seconds`), one batch out at a time "
        "(gateway.charging `Booker._send`); *asks per batch*: holds, settlements and releases per "
        "transaction (`fairgate_billing_batch_asks`). Each request asks twice (hold, settlement).",
        "- *answers waiting for billing* (latency rounds; `fairgate_billing_wait_seconds`): answers whose "
        "end waited for their settlement's journal line (billing.journal: with FAIRGATE_JOURNAL_WAIT=write "
        "written as it is kept, so none waits; with FAIRGATE_JOURNAL_WAIT=sync written at the end of "
        "the event loop's turn and synced: the journal's syncer "
        "process syncs it and answers, the event loop reads that), and "
        "answers whose first byte waited for their early hold, still being booked when the backend "
        "answered; in brackets the mean of those waits. Billing off waits for neither.",
        "- *commits/s*: transactions committed in its database (pg_stat_database.xact_commit).",
        "- *where the billing worker's connection was*: `pg_stat_activity` of its backend sampled every "
        f"{SAMPLE_INTERVAL_MS:.0f} ms by a process of its own: *idle* = no transaction open (waiting for "
        "the next batch), *idle in transaction* = waiting for the worker's next statement (the worker's "
        "Python between statements, and the socket's round trip), *running* = executing a statement, "
        "*IO:WALSync/WALWrite* = flushing WAL at commit, *Lock:...* = waiting for a row lock.",
    ]
    return "\n".join(parts) + "\n"


def _stalls(phase) -> str:
    stalls = getattr(phase, "stalls_ms", ())
    return f"{len(stalls)} ({max(stalls):.0f} ms)" if stalls else "0"


def latency_section(rows: list[dict]) -> list[str]:
    """rows: one per round: {"direct": Phase, "billing on": Phase, "billing off": Phase, "usage": {...}},
    plus the pooled one (round "all")."""
    lines = [
        f"### Added latency at {rows[0]['rate']:.0f} requests/s (Poisson arrivals, {len(rows) - 1} alternated rounds)",
        "",
        "| round | direct p50 / p99 | billing on p50 / p99 | billing off p50 / p99 | added p99 on | "
        "added p99 off | on / off | target (on <= 3x off) | failed on / off | machine stalls direct / on / off |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    every_round = True
    for row in rows:
        direct, on, off = row["direct"], row["billing on"], row["billing off"]
        added_on, added_off = _diff(on.p99_ms, direct.p99_ms), _diff(off.p99_ms, direct.p99_ms)
        ratio = added_on / added_off if added_on is not None and added_off and added_off > 0 else None
        met = ratio is not None and ratio <= 3.0
        if row["round"] == "all":  # one round's noise (a stall of billing off's, say) must not decide it
            met = met and every_round
        else:
            every_round = every_round and met
        verdict = "–" if ratio is None else ("yes" if met else "**no**")
        name = f"**{row['round']}**" if row["round"] == "all" else row["round"]
        lines.append(
            f"| {name} | {_ms(direct.p50_ms)} / {_ms(direct.p99_ms)} | {_ms(on.p50_ms)} / {_ms(on.p99_ms)} | "
            f"{_ms(off.p50_ms)} / {_ms(off.p99_ms)} | {_ms(added_on)} | {_ms(added_off)} | "
            f"{'–' if ratio is None else f'{ratio:.1f}x'} | {verdict} | "
            f"{_failed(on)} / {_failed(off)} | {_stalls(direct)} / {_stalls(on)} / {_stalls(off)} |"
        )
    lines += [
        "",
        "- added p99 = gateway p99 - direct p99 of the same round (a difference of percentiles); "
        "\"all\" pools every round's latencies; its target is met only if every round's is.",
        "- machine stalls: how many times during the run an idle process of its own (bench.canary) woke "
        f"up {STALL_MS:.0f} ms or more late, and the longest (ms): a shared VM can stop as a "
        "whole, every process at once, which a round then measures with its system. Rounds are kept as "
        "measured, stalls or not.",
        "",
        f"| round | gateway | {USAGE_HEADER} | CPU per request | answers waiting for their settlement's journal "
        "(mean wait) | answers waiting for their early hold (mean wait) |",
        "|---|---|" + "---|" * 10,
    ]
    for row in rows:
        if row["round"] == "all":
            continue
        for name in ("billing on", "billing off"):
            phase = row[name]
            cpu = phase.gateway_cpu_ms_per_request
            lines.append(
                f"| {row['round']} | {name} | {usage_columns(row['usage'].get(name))} | "
                f"{'–' if cpu is None else f'{cpu:.2f} ms'} | {_waits(row['usage'].get(name), 'settlement')} | "
                f"{_waits(row['usage'].get(name), 'hold')} |"
            )
    return lines


def _waits(usage: Usage | None, step: str) -> str:
    """How many answers of the run waited for billing's ``step`` (fairgate_billing_wait_seconds), and how long."""
    if usage is None:
        return "–"
    count, mean_ms = getattr(usage, f"{step}_waits"), getattr(usage, f"{step}_wait_ms")
    return "0" if not count else f"{count} ({_ms(mean_ms)})"


def _failed(phase) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(phase.failures.items())) or "0"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def saturation_section(runs: dict[str, list], ratio_target: float) -> list[str]:
    on_runs, off_runs = runs["billing on"], runs["billing off"]
    conns = sorted({r.connections for r in on_runs})
    rounds = len(on_runs) // max(len(conns), 1)

    def by(runs_of, clients):
        return [r for r in runs_of if r.connections == clients]

    lines = [
        f"### Billing on vs off (closed loop, {rounds} alternated rounds)",
        "",
        "| connections | billing on (per round) | mean | billing off (per round) | mean | ratio of means |",
        "|---|---|---|---|---|---|",
    ]
    means = {}
    for clients in conns:
        on, off = by(on_runs, clients), by(off_runs, clients)
        m_on, m_off = mean(r.ok_per_s for r in on), mean(r.ok_per_s for r in off) if off else 0.0
        means[clients] = (m_on, m_off)
        lines.append(
            f"| {clients} | {', '.join(f'{r.ok_per_s:.0f}' for r in on)} | {m_on:.0f}/s | "
            f"{', '.join(f'{r.ok_per_s:.0f}' for r in off)} | {m_off:.0f}/s | "
            f"{m_on / m_off if m_off else 0:.0%} |"
        )
    peak_on = max(conns, key=lambda c: means[c][0])
    peak_off = max(conns, key=lambda c: means[c][1])
    ratio = means[peak_on][0] / means[peak_off][1] if means[peak_off][1] else 0.0
    best_on = max(r.ok_per_s for r in on_runs)
    best_off = max(r.ok_per_s for r in off_runs)
    lines += [
        "",
        f"- throughput, the peak over the concurrencies: billing on {means[peak_on][0]:.0f}/s "
        f"({peak_on} connections), billing off {means[peak_off][1]:.0f}/s ({peak_off} connections): "
        f"**{ratio:.0%}** (target >= {ratio_target:.0%}: {'yes' if ratio >= ratio_target else '**no**'}); "
        f"best single runs {best_on:.0f}/s and {best_off:.0f}/s: {best_on / best_off if best_off else 0:.0%}",
        "",
        f"| connections | gateway | {USAGE_HEADER} | commits/s | ledger seq scans (rows read) |",
        "|---|---|" + "---|" * 9,
    ]
    for clients in conns:
        for name, runs_of in (("billing on", on_runs), ("billing off", off_runs)):
            mine = [r.usage for r in by(runs_of, clients) if r.usage is not None]
            scans = sum(u.ledger_seq_scans or 0 for u in mine)
            rows = sum(u.ledger_seq_rows or 0 for u in mine)
            lines.append(
                f"| {clients} | {name} | {usage_columns(_mean_usage(mine))} | "
                f"{_num(_mean(u.commits_per_s for u in mine), 0)} | {scans} ({rows:,}) |"
            )
    on_waits = [r for r in on_runs if r.waits]
    if on_waits:
        states = sorted(
            {s for r in on_waits for s in r.waits.get("billing worker", {})},
            key=lambda s: (s not in WAIT_COLUMNS, WAIT_COLUMNS.index(s) if s in WAIT_COLUMNS else 0, s),
        )
        lines += [
            "",
            "Where the billing worker's connection was (billing on; share of the samples, means over the rounds):",
            "",
            "| connections | batch round trip p50 / p99 (bucket) | the worker's backend busy | "
            + " | ".join(states)
            + " |",
            "|---|---|---|" + "---|" * len(states),
        ]
        for clients in conns:
            mine = by(on_waits, clients)
            shares = _merge_waits(mine)
            usage = _mean_usage([r.usage for r in mine if r.usage is not None])
            quantiles = (
                "–"
                if usage is None
                else (f"<= {_ms(usage.batch_quantile_ms(0.5))} / <= {_ms(usage.batch_quantile_ms(0.99))}")
            )
            backend = _mean(
                r.waits["cpu_s"].get("billing worker", 0.0) / r.waits["seconds"] for r in mine if r.waits.get("seconds")
            )
            lines.append(
                f"| {clients} | {quantiles} | {_pct(backend)} | "
                + " | ".join(_pct(shares.get(s, 0.0)) for s in states)
                + " |"
            )
    return lines


def _mean_usage(usages: list[Usage]) -> Usage | None:
    if not usages:
        return None
    buckets: Counter = Counter()
    for u in usages:
        buckets.update(u.batch_ms_buckets)
    return Usage(
        seconds=sum(u.seconds for u in usages),
        gateway_busy=mean(u.gateway_busy for u in usages),
        gateway_cpu_wait=_mean(u.gateway_cpu_wait for u in usages),
        worker_cpu_wait=_mean(u.worker_cpu_wait for u in usages),
        database_cpu_wait=_mean(u.database_cpu_wait for u in usages),
        worker_busy=mean(u.worker_busy for u in usages),
        database_busy=_mean(u.database_busy for u in usages),
        machine_busy=mean(u.machine_busy for u in usages),
        commits_per_s=_mean(u.commits_per_s for u in usages),
        batches_per_s=mean(u.batches_per_s for u in usages),
        asks_per_batch=_mean(u.asks_per_batch for u in usages),
        batch_ms=_mean(u.batch_ms for u in usages),
        batch_ms_buckets=dict(buckets),
    )


def report_write(markdown: str, path: Path = REPORT_PATH) -> Path:
    if not path.exists():
        path.write_text(
            "# Fairgate live benchmarks on PostgreSQL\n\nMeasured against the real gateway "
            "(`manage.py serve`) on PostgreSQL and the simulated GPU backend over HTTP on this machine; "
            "rewritten by the command named in the section. The SQLite figures are in "
            "REPORT-gateway.md.\n",
            encoding="utf-8",
        )
    return section_write("overhead-postgres", markdown, path)
