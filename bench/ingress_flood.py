"""A batch flood at the ingress: what it does to interactive requests, with the intake lanes and
without them, side by side in one run.

    python -m bench.ingress_flood [--flood 2000] [--rounds 3] [--concurrency 2] [--baseline TREE] [--profile DIR]
    python -m bench.ingress_flood --random-keys [--rounds 5] [--seconds 6] [--via-nginx] [--baseline TREE]

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
setting, into ``DIR/<setting>.txt`` (collapsed stacks per thread, py-spy's ``raw`` format); with
``--random-keys``, through each setting's first second of round 1 (the flood's first wave).

``--random-keys`` compares instead "no flood" with "random-key flood" and "random-key flood, no
connection limit" (all this tree, lanes on; the last with ``FAIRGATE_CONNECTIONS_PER_ADDRESS=0``,
left out with ``--via-nginx``):
for the whole run (``--seconds``, 6 by default), a process of its own (its CPU reported) sends the
flood's requests back to back
on ``min(--flood, 1000)`` connections from 127.0.0.2 (the probes come from 127.0.0.1), each with a
made-up key of the right shape (a new prefix each: a key cache miss), as fast as the gateway
answers them; the interactive probes' p99 is set beside the same run's no-flood p99. The gateway's
CPU is reported over the run and over the flood's first second (its first wave), and the machine's
1-minute load average at the end of each run.
``--flood-nice N`` runs the flood's process at that nice level (on a machine of few cores, an
attacker's own CPU otherwise competes with the gateway's).
``--via-nginx`` sends probes and flood through nginx configured by docs/production.md's server
block (plain HTTP, `bench.nginx_front`; the gateway trusts it as its proxy), its CPU reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import launch, rawhttp
from bench.launch import start_gateway, start_sim
from bench.loadgen import percentile
from bench.nginx_front import start_nginx

NO_LANES = "100000"
PROBE_GAP_S = 0.02
FLOOD_SOURCE = "127.0.0.2"  # --random-keys: the flood's client address (the probes' is 127.0.0.1)
SLOWEST_SHOWN = 5  # --random-keys: the slowest probes of each run, with when they started
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


async def _one(base: str, key: str, body: bytes, cls: str, source: str | None = None) -> tuple[int, float]:
    host, port = rawhttp.split_url(base)
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0) if source else None)
    started_s = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}", "X-Priority-Class": cls}
    writer.write(rawhttp.request_bytes(host, port, "/v1/chat/completions", body, headers))
    await writer.drain()
    head = await rawhttp.read_head(reader)
    await rawhttp.read_body(reader, head)
    writer.close()
    return head.status, time.perf_counter() - started_s


def _random_key(rng: random.Random) -> str:
    return f"fg_{rng.getrandbits(40):010x}_{rng.getrandbits(192):048x}"


async def _random_flood(url: str, bodies: list[bytes], rng: random.Random, duration_s: float, rate: float) -> list[int]:
    """Requests with made-up keys until ``duration_s`` is over, on ``len(bodies)`` connections at
    most: back to back (``rate`` 0: as fast as they are answered), or one started every 1/``rate``
    s. The statuses answered (0: the connection failed)."""
    end_s = time.perf_counter() + duration_s
    statuses: list[int] = []
    connections = asyncio.Semaphore(len(bodies))

    async def one(body: bytes) -> None:
        async with connections:
            try:
                status, _ = await _one(url, _random_key(rng), body, "BATCH", FLOOD_SOURCE)
            except (OSError, asyncio.IncompleteReadError):
                status = 0
        statuses.append(status)

    async def sender(body: bytes) -> None:
        while time.perf_counter() < end_s:
            await one(body)

    if rate <= 0:
        await asyncio.gather(*(sender(b) for b in bodies))
        return statuses
    tasks = []
    started_s = time.perf_counter()
    while (now_s := time.perf_counter()) < end_s:
        tasks.append(asyncio.create_task(one(bodies[len(tasks) % len(bodies)])))
        await asyncio.sleep(max(0.0, started_s + len(tasks) / rate - now_s))
    await asyncio.gather(*tasks)
    return statuses


async def _flood_child(
    url: str, connections: int, rate: float, seed: int, seconds: float, nice: int = 0
) -> asyncio.subprocess.Process:
    """The random-key flood in a process of its own (its work must not delay the probes' event
    loop), ready to start on a line on its stdin; at ``nice`` (an attacker on another machine takes
    none of the gateway's cores)."""
    argv = ["nice", "-n", str(nice)] if nice else []
    argv += [sys.executable, "-m", "bench.ingress_flood", "--flood-child", url, "--flood", str(connections)]
    argv += ["--flood-rate", str(rate), "--seed", str(seed), "--seconds", str(seconds)]
    child = await asyncio.create_subprocess_exec(
        *argv, cwd=launch.REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    await child.stdout.readline()  # "ready": its bodies are made
    return child


async def flood_child_main(url: str, connections: int, rate: float, seed: int, seconds: float) -> None:
    """`--flood-child`: waits for "go" on stdin, floods for ``seconds``, prints its statuses and CPU."""
    rng = random.Random(seed)
    bodies = [_body(rng, rng.randint(2_000, 16_000)) for _ in range(connections)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    statuses = await _random_flood(url, bodies, rng, seconds, rate)
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = used.ru_utime + used.ru_stime - cpu_start.ru_utime - cpu_start.ru_stime
    print(json.dumps({"statuses": statuses, "cpu_s": cpu_s}), flush=True)


async def _probes(
    url: str, key: str, body: bytes, duration_s: float, starts: list[float] | None = None
) -> list[tuple[int, float]]:
    """Open loop: a probe every PROBE_GAP_S, whatever the earlier ones are doing; each one's start
    (seconds into the run) appended to ``starts`` if given."""
    tasks = []
    begun_s = time.perf_counter()
    end_s = begun_s + duration_s
    while (now_s := time.perf_counter()) < end_s:
        if starts is not None:
            starts.append(now_s - begun_s)
        tasks.append(asyncio.create_task(_one(url, key, body, "INTERACTIVE")))
        await asyncio.sleep(PROBE_GAP_S)
    return list(await asyncio.gather(*tasks))


def _profiler(pid: int, out: Path | None, duration_s: float) -> subprocess.Popen | None:
    """py-spy sampling process ``pid`` for ``duration_s`` into ``out`` (None: no profile)."""
    if out is None:
        return None
    py_spy = shutil.which("py-spy") or Path(sys.executable).with_name("py-spy")
    argv = [str(py_spy), "record", "--pid", str(pid), "--duration", str(int(duration_s)), "--rate", "200"]
    argv += ["--format", "raw", "--threads", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _start(var: Path, sim_url: str, concurrency: str, tree: Path | None, **env: str) -> launch.Server:
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
            **env,
        )
    finally:
        launch.REPO_ROOT = this_tree


async def _run_random(
    sim_url: str,
    var: Path,
    setting: tuple[bool, Path | None, dict[str, str]],
    flood: int,
    rate: float,
    seed: int,
    via_nginx: bool = False,
    profile: Path | None = None,
    seconds: float = 6.0,
    flood_nice: int = 0,
) -> dict:
    """One run of ``--random-keys``: probes for ``seconds``, beside a random-key flood if the setting
    says so; both through nginx in front of the gateway if ``via_nginx``."""
    flooded, tree, env = setting
    if via_nginx:
        env = {"FAIRGATE_TRUSTED_PROXIES": "127.0.0.1", **env}
    gateway = _start(var, sim_url, "2", tree, **env)
    front = start_nginx(var / "nginx", gateway.url) if via_nginx else None
    url = front.url if front is not None else gateway.url
    rng = random.Random(seed)
    try:
        probe = _body(rng, 800)
        await _probes(url, gateway.keys["chat"], probe, 1.0)  # warm: the valid key is cached
        front_cpu_s = launch._cpu_s(front.process.pid) if front is not None else 0.0
        child = await _flood_child(url, min(flood, 1_000), rate, seed, seconds, flood_nice) if flooded else None
        profiler = _profiler(gateway.process.pid, profile, 1.0)  # the first wave
        if profiler is not None:
            await asyncio.sleep(0.3)  # py-spy attached
        gateway_cpu_s = gateway.own_cpu_s()
        started_s = time.perf_counter()
        if child is not None:
            child.stdin.write(b"go\n")  # type: ignore[union-attr]
        starts: list[float] = []

        async def first_second() -> float:
            await asyncio.sleep(1.0)
            return gateway.own_cpu_s() - gateway_cpu_s

        first = asyncio.create_task(first_second())
        during = await _probes(url, gateway.keys["chat"], probe, seconds, starts)
        sent = json.loads((await child.communicate())[0]) if child is not None else {"statuses": [], "cpu_s": 0.0}
        flood_s = time.perf_counter() - started_s
        gateway_cpu_s = gateway.own_cpu_s() - gateway_cpu_s
        front_cpu_s = launch._cpu_s(front.process.pid) - front_cpu_s if front is not None else 0.0
        if profiler is not None:
            await asyncio.to_thread(profiler.wait)
        statuses = sent["statuses"]
        return {
            "during": sorted(t for s, t in during if s == 200),
            "slowest": sorted(zip((t for _, t in during), starts), reverse=True)[:SLOWEST_SHOWN],
            "probe_failed": sum(1 for s, _ in during if s != 200),
            "refused": sum(1 for s in statuses if s == 401),
            "limited": sum(1 for s in statuses if s == 429),
            "other": sum(1 for s in statuses if s not in (401, 429)),
            "rate": len(statuses) / flood_s,
            "flood_cpu": sent["cpu_s"] / flood_s,
            "nginx_cpu": front_cpu_s / flood_s,
            "gateway_cpu": gateway_cpu_s / flood_s,
            "gateway_cpu_first": await first,
            "load": os.getloadavg()[0],
        }
    finally:
        if front is not None:
            front.stop()
        gateway.stop()


async def main_random(args: argparse.Namespace) -> None:
    """``--random-keys``: no flood and a random-key flood, alternated, the order flipped each round."""
    root = Path(tempfile.mkdtemp(prefix="fg-keyflood-"))
    sim = start_sim(root / "sim", slots=64, ttft_ms=5, tokens_per_s=5000)
    settings: dict[str, tuple[bool, Path | None, dict[str, str]]] = {
        "no flood": (False, None, {}),
        "random-key flood": (True, None, {}),
    }
    if not args.via_nginx:  # through nginx the gateway's limit never applies (nginx is its trusted proxy)
        settings["random-key flood, no connection limit"] = (True, None, {"FAIRGATE_CONNECTIONS_PER_ADDRESS": "0"})
    if args.baseline:
        settings[f"random-key flood at {args.baseline}"] = (True, args.baseline.resolve(), {})
    rate = f"{args.flood_rate:.0f} requests/s" if args.flood_rate > 0 else "back to back"
    print(f"flood: made-up keys, {rate}, on at most {min(args.flood, 1_000)} connections from {FLOOD_SOURCE}")
    if args.flood_nice:
        print(f"the flood's process at nice {args.flood_nice}")
    if args.via_nginx:
        print("through nginx (docs/production.md's server block, plain HTTP) in front of each gateway")
    pooled: dict[str, list[float]] = {name: [] for name in settings}
    p99s: dict[str, list[float | None]] = {name: [] for name in settings}  # per round
    print(f"1-minute load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)\n")
    print(
        "| round | setting | p50 / p95 / p99 | probes failed | flood 401 / 429 / other | flood rate | flood CPU "
        "| gateway CPU (first second) | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    cpu_start, wall_start_s = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    try:
        for index in range(args.rounds):
            order = list(settings) if index % 2 == 0 else list(reversed(settings))
            for name in order:
                found = await _run_random(
                    sim.url,
                    root / f"{index}-{len(pooled[name])}-{name[:40].replace(' ', '-').replace(',', '')}",
                    settings[name],
                    args.flood,
                    args.flood_rate,
                    index,
                    args.via_nginx,
                    _profile_path(args.profile, name) if index == 0 else None,
                    args.seconds,
                    args.flood_nice,
                )
                pooled[name] += found["during"]
                during = found["during"]
                p99s[name].append(percentile(during, 0.99))
                nginx_cpu = f" (nginx {found['nginx_cpu']:.2f})" if args.via_nginx else ""
                print(
                    f"| {index + 1} | {name} | {_ms(during, 0.5)} / {_ms(during, 0.95)} / {_ms(during, 0.99)} "
                    f"| {found['probe_failed']} | {found['refused']} / {found['limited']} / {found['other']} "
                    f"| {found['rate']:.0f}/s "
                    f"| {found['flood_cpu']:.2f} core{nginx_cpu} | {found['gateway_cpu']:.2f} core "
                    f"({found['gateway_cpu_first']:.2f} s) | {found['load']:.1f} |",
                    flush=True,
                )
                slowest = ", ".join(f"{1000 * t:.0f} ms at {at:.2f} s" for t, at in found["slowest"])
                print(f"|  | slowest probes, when they started | {slowest} | | | | | | |", flush=True)
    finally:
        sim.stop()
    for name, values in pooled.items():
        print(f"| all | {name} | {_ms(values, 0.5)} / {_ms(values, 0.95)} / {_ms(values, 0.99)} | | | | | | |")
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = used.ru_utime + used.ru_stime - cpu_start.ru_utime - cpu_start.ru_stime
    print(f"\nprobes' load generator: {cpu_s / (time.perf_counter() - wall_start_s):.2f} of a core on average")
    alone = percentile(pooled["no flood"], 0.99)
    for name in list(settings)[1:]:
        flooded = percentile(pooled[name], 0.99)
        if alone and flooded:
            print(f"\np99, {name} / no flood: {flooded / alone:.2f}x pooled", end="")
        ratios = [f / a for f, a in zip(p99s[name], p99s["no flood"]) if f and a]
        if ratios:
            listed = ", ".join(f"{r:.2f}" for r in ratios)
            print(f"; per round {listed}; median of rounds {statistics.median(ratios):.2f}x")
    print(f"1-minute load average at the end: {os.getloadavg()[0]:.1f}")


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


def _profile_path(directory: Path | None, setting: str) -> Path | None:
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{setting.replace(' ', '-').replace(',', '').replace('/', '_')}.txt"


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
    parser.add_argument("--random-keys", action="store_true", help="a flood of made-up keys against no flood")
    parser.add_argument(
        "--flood-rate", type=float, default=0.0, help="--random-keys: requests/s of the flood (0: back to back)"
    )
    parser.add_argument(
        "--via-nginx", action="store_true", help="--random-keys: through docs/production.md's nginx (plain HTTP)"
    )
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="--random-keys: how long each run's probes (and flood) go"
    )
    parser.add_argument("--flood-nice", type=int, default=0, help="--random-keys: the flood's process at this nice")
    parser.add_argument("--flood-child", metavar="URL", help=argparse.SUPPRESS)  # the random-key flood's process
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood_child:
        asyncio.run(flood_child_main(args.flood_child, args.flood, args.flood_rate, args.seed, args.seconds))
        return
    asyncio.run(main_random(args) if args.random_keys else main_async(args))


if __name__ == "__main__":
    main()
