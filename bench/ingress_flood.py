"""A batch flood at the ingress: what it does to interactive requests, with the intake lanes and
without them, side by side in one run.

    python -m bench.ingress_flood [--flood 2000] [--rounds 3] [--concurrency 2] [--baseline TREE] [--profile DIR]

Processes: one simulated backend (64 slots, answers in a few ms: slots are never what waits) and,
for each round and each setting, a fresh gateway (`manage.py serve`, SQLite, billing off), the
settings alternated and their order flipped each round. Each run sends interactive probes open
loop (one every 20 ms) for 2 s alone, then ``--flood`` BATCH requests of 2-16 KB prompts at once
(at most 1,000 connections) while the probes go on for 6 s. A probe's latency is its whole answer
(a 5-token reply). "lanes" is ``FAIRGATE_INTAKE_CONCURRENCY=--concurrency``; "no lanes" lets
every intake run at once (``FAIRGATE_INTAKE_CONCURRENCY=100000``: first come, first served, as
before the lanes). ``--baseline TREE`` adds a third setting, "lanes at TREE": the lanes run by
another checkout's code (e.g. ``git archive <commit> | tar -x -C TREE``), to compare a change side
by side. The load generator is this process; its CPU is reported, and the machine's load average
at the start and the end. ``--profile DIR``
samples the gateway with py-spy (``pip install py-spy``) through the first round's flood of each
setting, into ``DIR/<setting>.txt`` (collapsed stacks per thread, py-spy's ``raw`` format).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import launch, rawhttp
from bench.launch import start_gateway, start_sim
from bench.loadgen import percentile

NO_LANES = "100000"
PROBE_GAP_S = 0.02
WORDS = "revenue quarter region growth margin forecast ledger invoice report audit".split()
YAML = """
scheduler:
  policy: fairgate
  classes:
    - {{name: INTERACTIVE, level: 0, sla_ms: 30000, price_factor: 1.6}}
    - {{name: BATCH, level: 2, sla_ms: 600000, price_factor: 0.7}}
  queue: {{depth_cap: 100000}}
  tenants:
    - {{slug: chat, name: Chat, quota_share: 0.5}}
    - {{slug: fin, name: Finance, quota_share: 0.5}}
  backends:
    - {{name: sim, url: "{url}/v1", models: [m], slots: 64}}
"""


def _prompt(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    length = 0
    while length < chars:
        words.append(rng.choice(WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)


def _body(rng: random.Random, chars: int) -> bytes:
    content = _prompt(rng, chars)
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 5}).encode()


async def _one(base: str, key: str, body: bytes, cls: str) -> tuple[int, float]:
    host, port = rawhttp.split_url(base)
    reader, writer = await asyncio.open_connection(host, port)
    started_s = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}", "X-Priority-Class": cls}
    writer.write(rawhttp.request_bytes(host, port, "/v1/chat/completions", body, headers))
    await writer.drain()
    head = await rawhttp.read_head(reader)
    await rawhttp.read_body(reader, head)
    writer.close()
    return head.status, time.perf_counter() - started_s


async def _probes(url: str, key: str, body: bytes, duration_s: float) -> list[tuple[int, float]]:
    """Open loop: a probe every PROBE_GAP_S, whatever the earlier ones are doing."""
    tasks = []
    end_s = time.perf_counter() + duration_s
    while time.perf_counter() < end_s:
        tasks.append(asyncio.create_task(_one(url, key, body, "INTERACTIVE")))
        await asyncio.sleep(PROBE_GAP_S)
    return list(await asyncio.gather(*tasks))


def _profiler(pid: int, out: Path | None, duration_s: float) -> subprocess.Popen | None:
    """py-spy sampling process ``pid`` for ``duration_s`` into ``out`` (None: no profile)."""
    if out is None:
        return None
    py_spy = Path(sys.executable).with_name("py-spy")
    argv = [str(py_spy), "record", "--pid", str(pid), "--duration", str(int(duration_s)), "--rate", "200"]
    argv += ["--format", "raw", "--threads", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _start(var: Path, sim_url: str, concurrency: str, tree: Path | None) -> launch.Server:
    """A fresh gateway run by this checkout's code, or by ``tree``'s (the baseline)."""
    this_tree = launch.REPO_ROOT
    launch.REPO_ROOT = tree or this_tree  # start_gateway runs manage.py from there
    try:
        return start_gateway(
            var,
            YAML.format(url=sim_url),
            {"chat": ("chat", "INTERACTIVE"), "fin": ("fin", "BATCH")},
            FAIRGATE_BILLING="0",
            FAIRGATE_INTAKE_CONCURRENCY=concurrency,
        )
    finally:
        launch.REPO_ROOT = this_tree


async def _run(
    sim_url: str, var: Path, setting: tuple[str, Path | None], flood: int, seed: int, profile: Path | None
) -> dict:
    gateway = _start(var, sim_url, *setting)
    rng = random.Random(seed)
    try:
        probe = _body(rng, 800)
        alone = await _probes(gateway.url, gateway.keys["chat"], probe, 2.0)
        bodies = [_body(rng, rng.randint(2_000, 16_000)) for _ in range(flood)]
        connections = asyncio.Semaphore(1_000)

        async def batch(body: bytes) -> tuple[int, float]:
            async with connections:
                return await _one(gateway.url, gateway.keys["fin"], body, "BATCH")

        async def flood_all() -> tuple[list[tuple[int, float]], float]:
            results = await asyncio.gather(*(batch(b) for b in bodies))
            return results, time.perf_counter() - started_s

        profiler = _profiler(gateway.process.pid, profile, 6.0)
        started_s = time.perf_counter()
        flooded = asyncio.create_task(flood_all())
        during = await _probes(gateway.url, gateway.keys["chat"], probe, 6.0)
        batch_results, flood_s = await flooded
        if profiler is not None:
            await asyncio.to_thread(profiler.wait)
        return {
            "alone": sorted(t for s, t in alone if s == 200),
            "during": sorted(t for s, t in during if s == 200),
            "probe_failed": sum(1 for s, _ in during if s != 200),
            "batch_ok": sum(1 for s, _ in batch_results if s == 200),
            "flood_s": flood_s,
        }
    finally:
        gateway.stop()


def _ms(values: list[float], q: float) -> str:
    value = percentile(values, q)
    return "-" if value is None else f"{value * 1000:.0f} ms"


async def main_async(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="fg-ingress-"))
    sim = start_sim(root / "sim", slots=64, ttft_ms=5, tokens_per_s=5000)
    settings: dict[str, tuple[str, Path | None]] = {"lanes": (str(args.concurrency), None)}
    if args.baseline:
        settings[f"lanes at {args.baseline}"] = (str(args.concurrency), args.baseline.resolve())
    settings["no lanes"] = (NO_LANES, None)
    print(f"1-minute load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)\n")
    pooled: dict[str, dict[str, list[float]]] = {name: {"alone": [], "during": []} for name in settings}
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    wall_start_s = time.perf_counter()
    print(
        "| round | setting | interactive alone p50 / p95 | during the flood p50 / p95 / max "
        "| probes failed | batch 200s | flood drained in |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        for index in range(args.rounds):
            order = list(settings) if index % 2 == 0 else list(reversed(settings))
            for name in order:
                slug = name.replace(" ", "-").replace("/", "_")
                var = root / f"{slug}-{index}"
                profile = args.profile / f"{slug}.txt" if args.profile and index == 0 else None
                found = await _run(sim.url, var, settings[name], args.flood, index, profile)
                pooled[name]["alone"] += found["alone"]
                pooled[name]["during"] += found["during"]
                print(
                    f"| {index + 1} | {name} | {_ms(found['alone'], 0.5)} / {_ms(found['alone'], 0.95)} "
                    f"| {_ms(found['during'], 0.5)} / {_ms(found['during'], 0.95)} / {_ms(found['during'], 1.0)} "
                    f"| {found['probe_failed']} | {found['batch_ok']} of {args.flood} | {found['flood_s']:.1f} s |",
                    flush=True,
                )
    finally:
        sim.stop()
    for name, values in pooled.items():
        print(
            f"| all | {name} | {_ms(values['alone'], 0.5)} / {_ms(values['alone'], 0.95)} "
            f"| {_ms(values['during'], 0.5)} / {_ms(values['during'], 0.95)} / {_ms(values['during'], 1.0)} | | | |"
        )
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = used.ru_utime + used.ru_stime - cpu_start.ru_utime - cpu_start.ru_stime
    print(f"\nload generator: {cpu_s / (time.perf_counter() - wall_start_s):.2f} of a core on average")
    print(f"1-minute load average at the end: {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ingress_flood", description=__doc__)
    parser.add_argument("--flood", type=int, default=2_000, help="BATCH requests sent at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2, help="FAIRGATE_INTAKE_CONCURRENCY of the lanes run")
    parser.add_argument("--baseline", type=Path, help="another checkout whose lanes run as a third setting")
    parser.add_argument("--profile", type=Path, help="py-spy the gateway through round 1's floods into this directory")
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
