"""What the gateway adds to a request, and what billing costs it, measured side by side in one run.

    python -m bench.gateway_overhead [--phase-s 10] [--step-s 8] [--quick] [--write-report]

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
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.launch import Server, start_gateway, start_sim
from bench.loadgen import Result, Target, closed_loop, open_loop, percentile
from bench.report_gateway import section_write
from gateway.surge.replay import run_sync

BACKEND_LATENCY_MS = 50
LATENCY_RATES = (100, 400)
STEP_RATES = (100, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 2000)
SUSTAIN_ADDED_P99_MS = 50.0
GENERATOR_LAG_LIMIT_MS = 10.0  # p99 of how late the generator started requests: above it, it is the bottleneck
SATURATION_CONNECTIONS = (128, 256, 512)
REQUEST_TIMEOUT_S = 10.0
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Say hello to the benchmark."}],
                   "max_tokens": 16}).encode()
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

    def target(self, name: str) -> Target:
        if name == "direct":
            return Target.of(self.sim.url, "/v1/chat/completions", BODY)
        gateway = self.gateways[name]
        auth = {"Authorization": f"Bearer {gateway.keys['bench']}"}
        return Target.of(gateway.url, "/v1/chat/completions", BODY, auth)

    def stop(self) -> None:
        for server in (*self.gateways.values(), self.sim):
            server.stop()


def stack_start(var_dir: Path) -> Stack:
    sim = start_sim(var_dir, slots=1_000_000, fixed_latency_ms=BACKEND_LATENCY_MS)
    gateways = {}
    try:
        for name, flag in (("billing on", "1"), ("billing off", "0")):
            gateways[name] = start_gateway(var_dir / flag, GATEWAY_YAML.format(url=sim.url),
                                           {"bench": ("bench", "INTERACTIVE")}, name=f"gateway-billing-{flag}",
                                           FAIRGATE_BILLING=flag)
    except BaseException:
        for server in (*gateways.values(), sim):
            server.stop()
        raise
    return Stack(sim, gateways)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Phase:
    """One open-loop run summarised (ms)."""

    target: str
    rate_per_s: float
    sent_per_s: float
    ok_share: float
    p50_ms: float | None
    p99_ms: float | None
    lag_p99_ms: float | None
    failures: dict[str, int]
    gateway_cpu_ms_per_request: float | None = None

    @classmethod
    def of(cls, target: str, result: Result, cpu_s: float | None = None) -> "Phase":
        return cls(target, result.offered_per_s, result.sent_per_s, result.ok / result.sent if result.sent else 0.0,
                   percentile(result.latencies_ms, 0.50), percentile(result.latencies_ms, 0.99),
                   percentile(result.send_lag_ms, 0.99), dict(result.errors),
                   None if cpu_s is None or not result.ok else 1000.0 * cpu_s / result.ok)


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
    await quiesce(stack)
    gateway = stack.gateways.get(name)
    cpu_before_s = gateway.cpu_s() if gateway else None
    result = await open_loop(stack.target(name), rate_per_s, duration_s, seed=seed, timeout_s=REQUEST_TIMEOUT_S)
    cpu_s = gateway.cpu_s() - cpu_before_s if gateway else None
    summary = Phase.of(name, result, cpu_s)
    _log(f"  {name:>11} @ {rate_per_s:>5.0f}/s: sent {summary.sent_per_s:.0f}/s, ok {summary.ok_share:.1%}, "
         f"p50 {_ms(summary.p50_ms)}, p99 {_ms(summary.p99_ms)}, send lag p99 {_ms(summary.lag_p99_ms)} "
         f"{summary.failures or ''}")
    return summary


def added(gateway: Phase, direct: Phase, attr: str) -> float | None:
    a, b = getattr(gateway, attr), getattr(direct, attr)
    return None if a is None or b is None else a - b


def sustained(gateway: Phase, direct: Phase) -> bool:
    extra_p99 = added(gateway, direct, "p99_ms")
    generator_kept_up = gateway.lag_p99_ms is not None and gateway.lag_p99_ms < GENERATOR_LAG_LIMIT_MS
    return (extra_p99 is not None and extra_p99 < SUSTAIN_ADDED_P99_MS and gateway.ok_share >= 0.999
            and generator_kept_up)


async def latency_phases(stack: Stack, phase_s: float, rates=LATENCY_RATES) -> list[tuple[Phase, Phase, Phase]]:
    rows = []
    for index, rate in enumerate(rates):
        _log(f"latency at {rate}/s")
        direct = await phase(stack, "direct", rate, phase_s, seed=index)
        rows.append((direct, await phase(stack, "billing on", rate, phase_s, seed=index),
                     await phase(stack, "billing off", rate, phase_s, seed=index)))
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


@dataclass(frozen=True)
class Saturated:
    """One closed-loop run: requests answered per second, and the share of one core the gateway's
    own process (its event loop; not the billing worker) used meanwhile."""

    connections: int
    ok_per_s: float
    busy: float


async def saturation(stack: Stack, duration_s: float, rounds: int = 2,
                     connections: tuple[int, ...] = SATURATION_CONNECTIONS) -> dict[str, list[Saturated]]:
    _log(f"saturation, {', '.join(map(str, connections))} connections")
    runs: dict[str, list[Saturated]] = {name: [] for name in stack.gateways}
    for _ in range(rounds):
        for clients in connections:
            for name, gateway in stack.gateways.items():
                await quiesce(stack)
                busy_before_s, started_s = gateway.own_cpu_s(), time.monotonic()
                result = await closed_loop(stack.target(name), clients, duration_s, timeout_s=REQUEST_TIMEOUT_S)
                busy = (gateway.own_cpu_s() - busy_before_s) / (time.monotonic() - started_s)
                runs[name].append(Saturated(clients, result.ok_per_s, busy))
                _log(f"  {name}, {clients} connections: {result.ok_per_s:.0f} requests/s, its process "
                     f"{busy:.0%} busy {result.errors or ''}")
    return runs


async def measure(stack: Stack, args) -> dict:
    return {
        "latency": await latency_phases(stack, args.phase_s, args.latency_rates),
        "steps": {name: await step_up(stack, name, args.step_s, args.rates) for name in stack.gateways},
        "saturation": await saturation(stack, args.step_s, args.rounds, args.connections),
        "rates": args.rates,
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def render(found: dict) -> str:
    from bench.gateway_overhead_report import render as render_report

    return render_report(found)


def _rates(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds per latency phase")
    parser.add_argument("--step-s", type=float, default=8.0, help="seconds per step-up and saturation run")
    parser.add_argument("--latency-rates", type=_rates, default=LATENCY_RATES, help="e.g. 100,400")
    parser.add_argument("--rates", type=_rates, default=STEP_RATES, help="step-up rates, e.g. 100,200,400")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the saturation runs")
    parser.add_argument("--connections", type=_rates, default=SATURATION_CONNECTIONS,
                        help="closed-loop concurrencies of the saturation runs, e.g. 128,256,512")
    parser.add_argument("--write-report", action="store_true", help="also write the section of bench/REPORT-gateway.md")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop our servers on kill, too
    load_before = os.getloadavg()[0]
    stack = stack_start(Path(tempfile.mkdtemp(prefix="fairgate-overhead-")))
    try:
        found = run_sync(measure(stack, args))
    finally:
        stack.stop()
    found["load_avg"] = (load_before, os.getloadavg()[0])
    text = render(found)
    print(text)
    if args.write_report:
        _log(f"wrote {section_write('overhead', text)}")


if __name__ == "__main__":
    main()
