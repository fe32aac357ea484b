"""What the gateway adds to a request, and what billing costs it, measured side by side in one run.

    python -m bench.gateway_overhead [--phase-s 10] [--step-s 8] [--write-report]
    python -m bench.gateway_overhead --database postgres [--rounds 2] [--write-report]

Processes: one simulated backend answering every request after a fixed 50 ms (slots far above
the load), one gateway with billing on and one with billing off (``FAIRGATE_BILLING=0``), each
``manage.py serve`` on a fresh SQLite database; the load generator is this process (raw asyncio
streams on uvloop, bench.loadgen). Every request is the same small non-streaming chat.

1. Added latency at 100 and 400 requests/s (Poisson arrivals): the same open-loop load sent
   directly to the backend and through each gateway; added = gateway percentile - direct
   percentile (a difference of percentiles, not a percentile of differences).
2. The highest rate one gateway process sustains: rates stepped up (100, 200, 400, 600, ...)
   until added p99 reaches 50 ms or requests fail or time out.
3. Billing's cost: throughput in a closed loop at 128, 256 and 512 connections, billing on and
   off alternated, each twice. A fixed number of clients measures latency as much as capacity
   (Little's law: a request that waits longer for its bookings leaves fewer in the gateway), so
   each gateway's peak over the concurrencies is its throughput; the ratio of the peaks is
   billing's cost (target >= 80%). How busy each gateway's own process was shows whether a run
   saturated it.

``--database postgres``: both gateways on PostgreSQL instead, each on a scratch database of its
own that the run creates and drops (on the server of ``--postgres-url``; bench.gateway_overhead_postgres).
The added latency at 200 requests/s (target: billing on's added p99 <= 3x billing off's) and the
closed loop (target: the ratio of the peaks >= 80%) alternate billing on and off ``--rounds``
times, the order flipping each round; the step-up comes last (``--rates ''`` skips it). Before each
run the scratch databases are ANALYZEd (``--stale-statistics``: not). Every run also records
how busy each gateway's own process, its billing worker, its database's backends and the whole
machine were, the Booker's batches (``fairgate_billing_batch_seconds``/``_asks`` from /metrics),
and, sampled from ``pg_stat_activity`` during the closed loop, where the billing worker's
connection was (idle, idle in a transaction, running, flushing WAL, waiting for a lock). Beside each
latency round it prints the machine's own stalls during it (bench.canary: a shared VM can stop as a
whole for a few hundred milliseconds, which a round then measures with its system).
``--write-report`` writes bench/REPORT-gateway-postgres.md (REPORT-gateway.md keeps SQLite's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from bench import gateway_overhead_postgres as pg
from bench import gateway_overhead_postgres_report as pg_report
from bench import gateway_overhead_report as sqlite_report
from bench.canary import Canary
from bench.gateway_overhead_results import (
    BACKEND_LATENCY_MS,
    STEP_RATES,
    Phase,
    Saturated,
    sustained,
)
from bench.launch import Server, scratch, start_gateway, start_sim
from bench.loadgen import Result, Target, closed_loop, open_loop
from bench.report_gateway import section_write
from bench.surge.traffic import run_sync

LATENCY_RATES = (100, 400)
POSTGRES_LATENCY_RATES = (200,)  # the production issue's rate
SATURATION_CONNECTIONS = (128, 256, 512)
REQUEST_TIMEOUT_S = 10.0
WARM_UP_S = 5.0  # PostgreSQL: the closed loop through each gateway before anything is measured
BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "Say hello to the benchmark."}], "max_tokens": 16}
).encode()
GATEWAY_YAML = """scheduler:
  policy: fairgate
  classes:
    - {{name: INTERACTIVE, level: 0, sla_ms: 3000,    price_factor: 1.6}}
    - {{name: NEAR_RT,     level: 1, sla_ms: 15000,   price_factor: 1.2}}
    - {{name: BATCH,       level: 2, sla_ms: 1800000, price_factor: 0.7}}
    - {{name: RETRY,       level: 3, sla_ms: 3600000, price_factor: 0.4}}
  queue: {{depth_cap: 20000}}
  tenants:
    - {{slug: bench, name: Bench, quota_share: 0.5, annual_budget: 1000000000}}
  backends:
    - {{name: sim, url: "{url}/v1", models: [m], slots: 4096, input_price_per_1k: 0.002, output_price_per_1k: 0.006}}
"""


@dataclass
class Stack:
    sim: Server
    gateways: dict[str, Server]  # "billing on" / "billing off"
    database: str = "sqlite"  # or "postgres"
    scratch: pg.Scratch | None = None  # the PostgreSQL databases of the run
    dbnames: dict[str, str] | None = None  # gateway name -> its database (PostgreSQL)
    meters: dict[str, pg.Meter] | None = None
    analyze: bool = True  # PostgreSQL: fresh planner statistics before every run (--stale-statistics: not)
    canary: Canary | None = None  # PostgreSQL: the machine's own stalls, printed beside each latency round

    def target(self, name: str) -> Target:
        if name == "direct":
            return Target.of(self.sim.url, "/v1/chat/completions", BODY)
        gateway = self.gateways[name]
        auth = {"Authorization": f"Bearer {gateway.keys['bench']}"}
        return Target.of(gateway.url, "/v1/chat/completions", BODY, auth)

    def stop(self) -> None:
        try:
            if self.canary is not None:
                self.canary.stop()
            for meter in (self.meters or {}).values():
                meter.close()
            for server in (*self.gateways.values(), self.sim):
                server.stop()
        finally:
            if self.scratch is not None:
                self.scratch.drop()


def stack_start(
    var_dir: Path, database: str = "sqlite", postgres_url: str = pg.SERVER_URL, analyze: bool = True
) -> Stack:
    """The simulated backend and both gateways: on SQLite files under ``var_dir``, or with
    ``database="postgres"`` each on a scratch database of its own on ``postgres_url``'s server."""
    scratch = pg.Scratch(postgres_url.rstrip("/")) if database == "postgres" else None
    sim = start_sim(var_dir, slots=1_000_000, fixed_latency_ms=BACKEND_LATENCY_MS)
    gateways, dbnames = {}, {}
    try:
        for name, flag in (("billing on", "1"), ("billing off", "0")):
            env = {"FAIRGATE_BILLING": flag}
            if scratch is not None:
                url = scratch.create("billing_" + ("on" if flag == "1" else "off"))
                dbnames[name] = url.rsplit("/", 1)[1]
                env.update(DATABASE_URL=url, SECRET_KEY=pg.SECRET_KEY)
            gateways[name] = start_gateway(
                var_dir / flag,
                GATEWAY_YAML.format(url=sim.url),
                {"bench": ("bench", "INTERACTIVE")},
                name=f"gateway-billing-{flag}",
                **env,
            )
    except BaseException:
        for server in (*gateways.values(), sim):
            server.stop()
        if scratch is not None:
            scratch.drop()
        raise
    if scratch is None:
        return Stack(sim, gateways)
    meters = {name: pg.Meter(gateway, scratch.server, dbnames[name]) for name, gateway in gateways.items()}
    return Stack(sim, gateways, database, scratch, dbnames, meters, analyze, Canary())


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def settle_database(stack: Stack, name: str) -> None:
    """PostgreSQL: ANALYZE the database ``name`` is about to be measured on (see pg.Meter.analyze)."""
    meter = (stack.meters or {}).get(name)
    if meter is not None and stack.analyze:
        await asyncio.to_thread(meter.analyze)


async def quiesce(stack: Stack, limit_s: float = 60.0) -> None:
    """Wait until no gateway is still working off an earlier phase's backlog (its requests timed out
    at the client, but holds and settlements may still run), so phases do not disturb each other."""
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + limit_s
    while loop.time() < deadline_s:
        before = [g.cpu_s() for g in stack.gateways.values()]
        await asyncio.sleep(0.5)
        busy_s = max(g.cpu_s() - b for g, b in zip(stack.gateways.values(), before))
        if busy_s < 0.05:
            return
    _log(f"  (a gateway was still busy after {limit_s:.0f} s)")


async def phase(stack: Stack, name: str, rate_per_s: float, duration_s: float, seed: int) -> Phase:
    await settle_database(stack, name)
    await quiesce(stack)
    gateway = stack.gateways.get(name)
    cpu_before_s = gateway.cpu_s() if gateway else None
    result = await open_loop(stack.target(name), rate_per_s, duration_s, seed=seed, timeout_s=REQUEST_TIMEOUT_S)
    cpu_s = gateway.cpu_s() - cpu_before_s if gateway else None
    summary = Phase.of(name, result, cpu_s)
    _log(
        f"  {name:>11} @ {rate_per_s:>5.0f}/s: sent {summary.sent_per_s:.0f}/s, ok {summary.ok_share:.1%}, "
        f"p50 {_ms(summary.p50_ms)}, p99 {_ms(summary.p99_ms)}, send lag p99 {_ms(summary.lag_p99_ms)} "
        f"{summary.failures or ''}"
    )
    return summary


async def latency_phases(stack: Stack, phase_s: float, rates=LATENCY_RATES) -> list[tuple[Phase, Phase, Phase]]:
    rows = []
    for index, rate in enumerate(rates):
        _log(f"latency at {rate}/s")
        direct = await phase(stack, "direct", rate, phase_s, seed=index)
        rows.append(
            (
                direct,
                await phase(stack, "billing on", rate, phase_s, seed=index),
                await phase(stack, "billing off", rate, phase_s, seed=index),
            )
        )
    return rows


async def step_up(stack: Stack, name: str, step_s: float, rates=STEP_RATES) -> list[tuple[Phase, Phase]]:
    _log(f"step-up, {name}")
    steps = []
    for index, rate in enumerate(rates):
        direct = await phase(stack, "direct", rate, step_s, seed=100 + index)
        gateway = await phase(stack, name, rate, step_s, seed=100 + index)
        steps.append((direct, gateway))
        if not sustained(gateway, direct):
            break
    return steps


async def saturation(
    stack: Stack, duration_s: float, rounds: int = 2, connections: tuple[int, ...] = SATURATION_CONNECTIONS
) -> dict[str, list[Saturated]]:
    _log(f"saturation, {', '.join(map(str, connections))} connections")
    runs: dict[str, list[Saturated]] = {name: [] for name in stack.gateways}
    for round_index in range(rounds):
        for clients in connections:
            for name in _order(stack, round_index):
                gateway = stack.gateways[name]
                await settle_database(stack, name)
                await quiesce(stack)
                meter, sampler = (stack.meters or {}).get(name), None
                if meter is not None:
                    before = await meter.take()
                    sampler = pg.WaitSampler(stack.scratch.server, stack.dbnames[name], gateway)
                busy_before_s, started_s = gateway.own_cpu_s(), time.monotonic()
                result = await closed_loop(stack.target(name), clients, duration_s, timeout_s=REQUEST_TIMEOUT_S)
                busy = (gateway.own_cpu_s() - busy_before_s) / (time.monotonic() - started_s)
                usage = waits = None
                if meter is not None:
                    waits = sampler.stop()
                    usage = await meter.usage(before)
                runs[name].append(Saturated(clients, result.ok_per_s, busy, usage, waits))
                _log(
                    f"  {name}, {clients} connections: {result.ok_per_s:.0f} requests/s, its process "
                    f"{busy:.0%} busy{_usage_note(usage, waits)} {result.errors or ''}"
                )
    return runs


def _order(stack: Stack, round_index: int) -> list[str]:
    """On SQLite billing on, then off, every time (as measured so far); on PostgreSQL the order
    flips every round, so neither always runs first."""
    names = list(stack.gateways)
    return names[::-1] if stack.database == "postgres" and round_index % 2 else names


def _usage_note(usage: pg.Usage | None, waits: dict | None = None) -> str:
    if usage is None:
        return ""
    note = (
        f", worker {usage.worker_busy:.0%}, its database {usage.database_busy or 0:.0%}, machine "
        f"{usage.machine_busy:.2f} cores; waited for a CPU: gateway {usage.gateway_cpu_wait or 0:.0%}, worker "
        f"{usage.worker_cpu_wait or 0:.0%}, database {usage.database_cpu_wait or 0:.0%}"
    )
    if usage.batch_ms is not None:
        note += (
            f"; {usage.batches_per_s:.0f} batches/s of {usage.asks_per_batch:.1f} asks, {usage.batch_ms:.1f} ms each"
        )
    if usage.ledger_seq_scans:
        note += f"; ledger seq scans {usage.ledger_seq_scans} ({usage.ledger_seq_rows:,} rows)"
    shares = pg_report.wait_shares(waits or {})
    if shares:
        note += "; worker's connection " + ", ".join(
            f"{s} {v:.0%}" for s, v in sorted(shares.items(), key=lambda kv: -kv[1])
        )
    return note


async def postgres_latency(stack: Stack, phase_s: float, rates, rounds: int) -> list[dict]:
    """At each rate, ``rounds`` rounds of direct, then both gateways (the order flips each round);
    one row per round and one pooling every round's latencies (round "all")."""
    rows = []
    for rate in rates:
        pooled: dict[str, list[Result]] = {name: [] for name in ("direct", *stack.gateways)}
        for round_index in range(rounds):
            _log(f"latency at {rate}/s, round {round_index + 1}")
            seed = 1000 * round_index + int(rate)
            row: dict = {"rate": rate, "round": str(round_index + 1), "usage": {}}
            row["direct"], result = await _open_phase(stack, "direct", rate, phase_s, seed)
            pooled["direct"].append(result)
            for name in _order(stack, round_index):
                meter = stack.meters[name]
                await settle_database(stack, name)
                await quiesce(stack)
                before = await meter.take()
                row[name], result = await _open_phase(stack, name, rate, phase_s, seed, settled=True)
                row["usage"][name] = usage = await meter.usage(before)
                pooled[name].append(result)
                _log(f"    {_usage_note(usage)[2:]}")
            rows.append(row)
        rows.append(
            {
                "rate": rate,
                "round": "all",
                "usage": {},
                **{
                    name: Phase.of(
                        name,
                        _pool(results),
                        stalls_ms=[ms for row in rows if row["rate"] == rate for ms in row[name].stalls_ms],
                    )
                    for name, results in pooled.items()
                },
            }
        )
    return rows


async def _open_phase(
    stack: Stack, name: str, rate_per_s: float, duration_s: float, seed: int, settled: bool = False
) -> tuple[Phase, Result]:
    """`phase`, also returning the run's latencies."""
    if not settled:
        await settle_database(stack, name)
        await quiesce(stack)
    gateway = stack.gateways.get(name)
    cpu_before_s = gateway.cpu_s() if gateway else None
    started = time.time()
    result = await open_loop(stack.target(name), rate_per_s, duration_s, seed=seed, timeout_s=REQUEST_TIMEOUT_S)
    stalls = stack.canary.between(started, time.time()) if stack.canary is not None else []
    summary = Phase.of(name, result, gateway.cpu_s() - cpu_before_s if gateway else None, stalls)
    _log(
        f"  {name:>11} @ {rate_per_s:>5.0f}/s: sent {summary.sent_per_s:.0f}/s, ok {summary.ok_share:.1%}, "
        f"p50 {_ms(summary.p50_ms)}, p99 {_ms(summary.p99_ms)}, send lag p99 {_ms(summary.lag_p99_ms)} "
        f"{summary.failures or ''}{_stalls_note(stalls)}"
    )
    return summary, result


def _stalls_note(stalls: list[float]) -> str:
    return f" (machine stalls: {len(stalls)}, longest {max(stalls):.0f} ms)" if stalls else ""


def _pool(results: list[Result]) -> Result:
    pooled = Result(offered_per_s=mean(r.offered_per_s for r in results), duration_s=sum(r.duration_s for r in results))
    for r in results:
        pooled.sent += r.sent
        pooled.ok += r.ok
        pooled.latencies_ms += r.latencies_ms
        pooled.send_lag_ms += r.send_lag_ms
        for kind, n in r.errors.items():
            pooled.errors[kind] = pooled.errors.get(kind, 0) + n
    return pooled


async def measure(stack: Stack, args) -> dict:
    if stack.database == "postgres":
        return await measure_postgres(stack, args)
    return {
        "latency": await latency_phases(stack, args.phase_s, args.latency_rates),
        "steps": {name: await step_up(stack, name, args.step_s, args.rates) for name in stack.gateways},
        "saturation": await saturation(stack, args.step_s, args.rounds, args.connections),
        "rates": args.rates,
    }


async def warm_up(stack: Stack, duration_s: float = WARM_UP_S, clients: int = 64) -> None:
    """PostgreSQL: a closed loop through each gateway before anything is measured, so that no run
    measures an empty ledger (a production ledger is never empty; ANALYZEd empty, the planner
    would read each batch's ledger entries with a sequential scan until autovacuum notices)."""
    for name in stack.gateways:
        result = await closed_loop(stack.target(name), clients, duration_s, timeout_s=REQUEST_TIMEOUT_S)
        _log(f"warm-up: {name}, {result.ok} requests")


async def measure_postgres(stack: Stack, args) -> dict:
    """The PostgreSQL mode: a warm-up, latency at the fixed rate(s), then the closed loop, then the
    step-up (the longest part, and the least asked for: last, so a short run can skip it with --rates '')."""
    if stack.analyze:
        await warm_up(stack)
    found = {
        "postgres": pg.server_settings(stack.scratch.server),
        "worker_nice": pg.worker_niceness(stack.gateways["billing on"].process.pid),
        "journal_wait": os.environ.get("FAIRGATE_JOURNAL_WAIT") or "write",  # the gateways' (settings' default)
        "analyzed": stack.analyze,
        "pg_latency": await postgres_latency(stack, args.phase_s, args.latency_rates, args.rounds),
        "saturation": await saturation(stack, args.step_s, args.rounds, args.connections),
        "rates": args.rates,
    }
    found["steps"] = (
        {name: await step_up(stack, name, args.step_s, args.rates) for name in stack.gateways} if args.rates else {}
    )
    return found


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def render(found: dict) -> str:
    if "pg_latency" in found:
        return pg_report.render(found)
    return sqlite_report.render(found)


def _rates(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="what both gateways run on: SQLite files (default) or scratch PostgreSQL databases",
    )
    parser.add_argument(
        "--postgres-url",
        default=pg.SERVER_URL,
        help=f"the PostgreSQL server for --database postgres (default {pg.SERVER_URL})",
    )
    parser.add_argument(
        "--stale-statistics",
        action="store_true",
        help="PostgreSQL: do not ANALYZE the scratch databases before each run (their ledger grows "
        "from empty, and the planner then scans all of it for every batch)",
    )
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds per latency phase")
    parser.add_argument("--step-s", type=float, default=8.0, help="seconds per step-up and saturation run")
    parser.add_argument(
        "--latency-rates",
        type=_rates,
        default=None,
        help=f"e.g. 100,400 (default {','.join(map(str, LATENCY_RATES))}; on PostgreSQL "
        f"{','.join(map(str, POSTGRES_LATENCY_RATES))})",
    )
    parser.add_argument("--rates", type=_rates, default=STEP_RATES, help="step-up rates, e.g. 100,200,400")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternations of the saturation runs (on PostgreSQL also of the latency runs)",
    )
    parser.add_argument(
        "--connections",
        type=_rates,
        default=SATURATION_CONNECTIONS,
        help="closed-loop concurrencies of the saturation runs, e.g. 128,256,512",
    )
    parser.add_argument(
        "--write-report",
        action="store_true",
        help="also write the section of bench/REPORT-gateway.md (on PostgreSQL: bench/REPORT-gateway-postgres.md)",
    )
    args = parser.parse_args(argv)
    if args.latency_rates is None:
        args.latency_rates = POSTGRES_LATENCY_RATES if args.database == "postgres" else LATENCY_RATES
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop our servers on kill, too
    load_before, started_s = os.getloadavg()[0], time.monotonic()
    with scratch("fairgate-overhead-") as work:
        stack = stack_start(work, args.database, args.postgres_url, analyze=not args.stale_statistics)
        try:
            found = run_sync(measure(stack, args))
        finally:
            stack.stop()
    found["load_avg"] = (load_before, os.getloadavg()[0])
    found["took_s"] = time.monotonic() - started_s
    text = render(found)
    print(text)
    if args.write_report:
        written = pg_report.report_write(text) if args.database == "postgres" else section_write("overhead", text)
        _log(f"wrote {written}")


if __name__ == "__main__":
    main()
