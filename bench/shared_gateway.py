"""The shared scheduler's cost at the gateway, side by side with the embedded one, in one run.

    python -m bench.shared_gateway [--rounds 3] [--phase-s 10] [--step-s 8]     (needs REDIS_URL)

Processes: one simulated backend answering after a fixed 50 ms (slots far above the load) and
three gateways, billing off (``FAIRGATE_BILLING=0``, so the database is not what is measured),
each ``manage.py serve`` on a SQLite file of its own: *embedded* (one process, the scheduler in
it), *shared* (one process, ``FAIRGATE_SCHEDULER=shared``: every decision through Redis and the
dispatcher's step, which this process holds), and *shared ×2* (``serve --workers 2``: two
gateway processes on one port sharing one scheduler). The load generator is this process.

Each round, in an order that flips every round:

1. **Added latency at 100 requests/s** (Poisson): direct to the backend, through *embedded* and
   through *shared*; added = gateway percentile - direct percentile. Targets: shared's p50 ≤ 1.5×
   and p99 ≤ 2× embedded's.
2. **CPU per request** during that phase: the gateway's process tree (with its children), plus,
   for the shared one, the Redis server's CPU. Target: shared ≤ 1.5× embedded.
3. **Peak throughput**: closed loops of 128 to 2,048 connections through *embedded* and
   *shared ×2*; each one's peak over them, with the connections and the latency p50 there (the
   shared path holds each request longer, so its closed loop needs more connections to fill the
   machine). Target: shared ×2 ≥ 1.3× embedded. The load generator's own CPU is reported (it
   shares the machine's 2 cores). Beside them, the **ceiling** of two processes on this machine:
   two independent embedded gateways (each with its own scheduler, so not a correct deployment —
   each would own every backend slot), the connections split between them. No sharing costs
   anything there, so ``--workers 2`` cannot beat it: it tells what the machine's two cores allow
   once the simulated backend and the load generator have taken theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

from bench.gateway_overhead import BODY, GATEWAY_YAML
from bench.gateway_overhead_results import BACKEND_LATENCY_MS
from bench.launch import Server, _cpu_s, start_gateway, start_sim
from bench.loadgen import Result, Target, closed_loop, open_loop, percentile

RATE = 100
CONNECTIONS = (128, 256, 512, 1024, 2048)
GATEWAYS = ("embedded", "shared", "shared x2", "pair a", "pair b")


def _redis_pid() -> int:
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def _snapshot_bytes(prefix: str) -> int:
    """The size of the shared dispatcher's last snapshot under ``prefix`` (0: none taken)."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        return int(client.hstrlen(f"{prefix}:snap", "state"))
    finally:
        client.close()


def start(var_dir: Path) -> tuple[Server, dict[str, Server], dict[str, str]]:
    """The backend, the gateways by name, and the shared ones' key prefixes."""
    sim = start_sim(var_dir, slots=1_000_000, fixed_latency_ms=BACKEND_LATENCY_MS)
    common = {"FAIRGATE_BILLING": "0", "SECRET_KEY": secrets.token_hex(16), "REDIS_URL": os.environ["REDIS_URL"]}
    gateways: dict[str, Server] = {}
    prefixes: dict[str, str] = {}
    try:
        for name in GATEWAYS:
            # FAIRGATE_SCHEDULER explicit both ways: with REDIS_URL set the shared one is the default
            extra = {"FAIRGATE_SCHEDULER": "shared" if name.startswith("shared") else "embedded"}
            extra["FAIRGATE_SHARED_PREFIX"] = prefixes[name] = f"bench:gw:{secrets.token_hex(3)}"
            gateways[name] = start_gateway(
                var_dir / name.replace(" ", ""),
                GATEWAY_YAML.format(url=sim.url),
                {"bench": ("bench", "INTERACTIVE")},
                name=name.replace(" ", ""),
                serve_args=("--workers", "2") if name == "shared x2" else (),
                **common,
                **extra,
            )
    except BaseException:
        for server in (*gateways.values(), sim):
            server.stop()
        raise
    return sim, gateways, prefixes


def _target(server: Server, direct: bool = False) -> Target:
    if direct:
        return Target.of(server.url, "/v1/chat/completions", BODY)
    return Target.of(server.url, "/v1/chat/completions", BODY, {"Authorization": f"Bearer {server.keys['bench']}"})


def _ms(result: Result, q: float) -> float:
    value = percentile(result.latencies_ms, q)
    return float("nan") if value is None else value


async def latency_round(sim: Server, gateways: dict[str, Server], phase_s: float, order: list[str], seed: int) -> dict:
    redis_pid = _redis_pid()
    found: dict[str, dict[str, float]] = {}
    for name in ["direct", *order]:
        target = _target(sim, direct=True) if name == "direct" else _target(gateways[name])
        server = None if name == "direct" else gateways[name]
        cpu0 = (server and _cpu_s(server.process.pid), _cpu_s(redis_pid))
        result = await open_loop(target, RATE, phase_s, seed=seed)
        cpu1 = (server and _cpu_s(server.process.pid), _cpu_s(redis_pid))
        row = {
            "p50": _ms(result, 0.5),
            "p99": _ms(result, 0.99),
            "ok": result.ok,
            "failed": sum(result.errors.values()),
        }
        if server is not None:
            redis_s = cpu1[1] - cpu0[1] if name != "embedded" else 0.0
            row["cpu_ms_per_request"] = 1000 * ((cpu1[0] - cpu0[0]) + redis_s) / max(result.ok, 1)
        found[name] = row
    return found


async def peak_round(gateways: dict[str, Server], step_s: float, order: list[str]) -> dict:
    found: dict[str, dict[int, float]] = {}
    for name in order:
        found[name] = {}
        servers = [gateways["pair a"], gateways["pair b"]] if name == "ceiling" else [gateways[name]]
        for connections in CONNECTIONS:
            cpu0 = time.process_time()
            share = connections // len(servers)
            results = await asyncio.gather(*(closed_loop(_target(server), share, step_s) for server in servers))
            found[name][connections] = sum(result.ok_per_s for result in results)
            latencies = [ms for result in results for ms in result.latencies_ms]
            found.setdefault(f"{name} p50 ms", {})[connections] = percentile(latencies, 0.5) or float("nan")
            found.setdefault(f"{name} failed", {})[connections] = sum(sum(r.errors.values()) for r in results)
            cores = found.setdefault("generator cores", {})
            cores[connections] = max(cores.get(connections, 0.0), (time.process_time() - cpu0) / step_s)
    return found


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sim, gateways, prefixes = start(Path(tmp))
        try:
            for name in GATEWAYS:  # warm: connections, tokenizer, the dispatcher's lease
                await closed_loop(_target(gateways[name]), 32, 2.0)
            latencies, peaks = [], []
            for r in range(args.rounds):
                order = ["embedded", "shared"] if r % 2 == 0 else ["shared", "embedded"]
                latencies.append(await latency_round(sim, gateways, args.phase_s, order, seed=r + 1))
                peak_order = ["embedded", "shared x2", "ceiling"]
                peak_order = peak_order if r % 2 == 0 else peak_order[::-1]
                peaks.append(await peak_round(gateways, args.step_s, peak_order))
                print(f"round {r + 1}: {latencies[-1]} {peaks[-1]}", file=sys.stderr, flush=True)
            snapshots = {name: _snapshot_bytes(prefixes[name]) for name in ("shared", "shared x2")}
        finally:
            for server in (*gateways.values(), sim):
                server.stop()
    report(latencies, peaks)
    print(f"the shared dispatchers' last snapshots: {', '.join(f'{n} {b:,} bytes' for n, b in snapshots.items())}")


def report(latencies: list[dict], peaks: list[dict]) -> None:
    def added(name: str, q: str) -> float:
        return mean(r[name][q] - r["direct"][q] for r in latencies)

    e50, e99, s50, s99 = (
        added("embedded", "p50"),
        added("embedded", "p99"),
        added("shared", "p50"),
        added("shared", "p99"),
    )
    print(f"added latency at {RATE}/s (mean of {len(latencies)} rounds):")
    print(f"  embedded p50 {e50:.2f} ms, p99 {e99:.2f} ms")
    print(f"  shared   p50 {s50:.2f} ms ({s50 / e50:.2f}x; target <= 1.5x), p99 {s99:.2f} ms ({s99 / e99:.2f}x; <= 2x)")
    ec = mean(r["embedded"]["cpu_ms_per_request"] for r in latencies)
    sc = mean(r["shared"]["cpu_ms_per_request"] for r in latencies)
    print(f"CPU per request: embedded {ec:.2f} ms, shared {sc:.2f} ms with Redis ({sc / ec:.2f}x; target <= 1.5x)")
    failed = {n: sum(r[n]["failed"] for r in latencies) for n in ("embedded", "shared")}
    print(f"failed requests: {failed}")
    names = ("embedded", "shared x2", "ceiling")
    at = {n: max(CONNECTIONS, key=lambda c, n=n: mean(p[n][c] for p in peaks)) for n in names}
    peak = {n: mean(p[n][at[n]] for p in peaks) for n in names}
    gen = max(mean(p["generator cores"][c] for p in peaks) for c in CONNECTIONS)
    per_round = {n: [round(max(p[n].values())) for p in peaks] for n in names}
    print(
        f"peak (closed loop {'/'.join(map(str, CONNECTIONS))} connections): embedded {peak['embedded']:.0f}/s, "
        f"serve --workers 2 shared {peak['shared x2']:.0f}/s ({peak['shared x2'] / peak['embedded']:.2f}x; "
        f"target >= 1.3x); ceiling of two processes here (two independent embedded gateways) "
        f"{peak['ceiling']:.0f}/s ({peak['ceiling'] / peak['embedded']:.2f}x); per round {per_round}; "
        f"load generator up to {gen:.2f} cores"
    )
    for n in names:
        p50 = mean(p[f"{n} p50 ms"][at[n]] for p in peaks)
        failed = sum(p[f"{n} failed"][c] for p in peaks for c in CONNECTIONS)
        print(f"  {n}: peak at {at[n]} connections, latency p50 there {p50:.0f} ms; failed requests {failed}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shared_gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--step-s", type=float, default=8.0)
    args = parser.parse_args(argv)
    if not os.environ.get("REDIS_URL"):
        parser.error("REDIS_URL must point at a Redis (the shared scheduler runs through it)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
