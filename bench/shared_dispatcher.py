"""The shared scheduler's dispatcher alone, fed by synthetic gateways through Redis, and its takeover.

    python -m bench.shared_dispatcher [--seconds 10] [--gateways 4] [--outstanding 256] [--rounds 2]
                                      [--peak-s 6] [--takeovers 5] [--takeover-rate 2000]

1. **Throughput.** One dispatcher (scheduling.shared.owner, in a process of its own) and
   ``--gateways`` synthetic gateways in this process (scheduling.shared.client, each with its own
   answer list and heartbeat). Each gateway keeps ``--outstanding`` requests in flight: a submit;
   when its grant arrives, the completion and the next submit. The backend has more slots than
   requests in flight, so every submit is granted in the step that takes it: what is measured is
   the dispatcher's rate of submit → grant → completion cycles through Redis (two commands, two
   answers, the engine's submit, dispatch and complete each). Reported with the CPU of the
   dispatcher's process, of this load generator, and of the Redis server.
2. **One gateway process's peak, in the same run**, to compare with: one ``manage.py serve``
   (embedded scheduler, billing off, a simulated backend answering after 50 ms with slots far
   above the load; bench.shared_gateway's set-up), closed loops of 128 and 256 connections, the
   higher rate. The two measures alternate, ``--rounds`` times, the order flipped each round; the
   ratio is of their means. Target (issue 13): the dispatcher ≥ 20× the gateway.
3. **Takeover.** Two dispatcher processes bid; two synthetic gateways keep a load of
   ``--takeover-rate`` requests/s going (default 2,000: two gateway processes at their peak, this machine's
   deployment); the lease holder is killed (SIGKILL) at a known instant, and the takeover time is
   from then to the first step the new owner committed (a step's stream id carries its commit
   time in ms). A new standby is started for the next round. The lease lasts
   `scheduling.shared.owner.LEASE_MS`. The load is paced, not the throughput part's closed loop:
   a dispatcher driven at its own saturation leaves a standby started beside it no CPU to catch
   up with (on two cores it replays more slowly than the owner logs, reloads the snapshot when
   the log is trimmed under it, and never reports ready).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from statistics import mean

from bench.gateway_overhead import GATEWAY_YAML
from bench.gateway_overhead_results import BACKEND_LATENCY_MS
from bench.launch import Server, start_gateway, start_sim
from bench.loadgen import closed_loop
from bench.shared_gateway import _target
from scheduling.engine.model import (
    AgingPolicy,
    BackendSpec,
    ClassSpec,
    FairnessPolicy,
    QueuePolicy,
    SchedulerConfig,
    TenantSpec,
)
from scheduling.shared.client import Client, connect
from scheduling.shared.owner import LEASE_MS, Owner
from scheduling.shared.protocol import Answer, submit
from scheduling.shared.replica import Keys

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
READY = "ready"  # what a dispatcher process of the takeover part prints once it follows the steps
READY_TIMEOUT_S = 60.0
REPO_ROOT = Path(__file__).resolve().parent.parent
TENANTS = tuple(TenantSpec(slug=f"t{i:02d}", quota_share=0.05) for i in range(20))
CLASSES = ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY")
PEAK_CONNECTIONS = (128, 256)


def bench_config() -> SchedulerConfig:
    """Four classes with long SLAs (nothing expires), 20 tenants, one backend with room for all."""
    hour = 3_600_000
    return SchedulerConfig(
        classes=tuple(ClassSpec(name, level, 10 * hour, Decimal("1")) for level, name in enumerate(CLASSES)),
        aging=AgingPolicy(mode="none"),
        fairness=FairnessPolicy(),
        queue=QueuePolicy(enforce_depth=False),
        tenants=TENANTS,
        backends=(BackendSpec(name="gpu", models=("m",), slots=1_000_000),),
    )


def _redis():  # type: ignore[no-untyped-def]
    return connect(REDIS_URL)


def serve_owner(prefix: str) -> None:
    """A dispatcher process (run as ``python -m bench.shared_dispatcher --owner PREFIX``)."""
    import logging

    logging.basicConfig(level=os.environ.get("BENCH_LOG", "WARNING"), format="%(asctime)s %(process)d %(message)s")

    async def run() -> None:
        client = _redis()
        owner = Owner(client, bench_config(), keys=Keys(prefix))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await owner.catch_up()  # a standby as a deployment has one: started, and following the steps
        print(READY, flush=True)
        await owner.run(stop=stop)
        await client.aclose()

    asyncio.run(run())


def _start_owner(prefix: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.shared_dispatcher", "--owner", prefix],
        cwd=REPO_ROOT,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        text=True,
    )


async def _ready(process: subprocess.Popen) -> None:
    """Returns once the dispatcher process ``process`` has started and caught up with the steps
    logged (it says so on its stdout), so that a takeover measures a standby, not a process start."""
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), timeout=READY_TIMEOUT_S)
    except TimeoutError:
        process.kill()  # ends the reading thread too (its pipe closes), so the run can end
        raise RuntimeError(f"dispatcher process {process.pid} was not ready within {READY_TIMEOUT_S:.0f} s") from None
    if line.strip() != READY:
        raise RuntimeError(f"dispatcher process {process.pid} ended before it was ready (exit {process.poll()})")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Load:
    """Synthetic gateways keeping ``outstanding`` requests each in flight."""

    redis: object
    keys: Keys
    gateways: int
    outstanding: int
    pace_per_s: float = 0.0  # submits per second, paced; 0: a closed loop of ``outstanding`` per gateway
    done: int = 0
    clients: list[Client] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    serial: int = 0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def _submit(self, client: Client) -> None:
        self.serial += 1
        tenant = TENANTS[self.serial % len(TENANTS)].slug
        cls = CLASSES[self.serial % len(CLASSES)]
        rid = f"{tenant}/{client.gateway}-{self.serial}"
        client.send(
            submit(client.gateway, rid, tenant=tenant, cls=cls, model="m", prompt_tokens=100, expected_output_tokens=50)
        )

    def _answer(self, client: Client, answer: Answer) -> None:
        if answer[0] == "granted":
            client.send(["complete", answer[1], 100, 50])
            self.done += 1
            if not self.pace_per_s:
                self._submit(client)
        elif answer[0] in ("refused", "expired") and not self.pace_per_s:
            self._submit(client)

    async def _pace(self) -> None:
        """``pace_per_s`` submits a second, spread over the gateways, in ticks of 10 ms."""
        tick_s, started, sent = 0.01, time.monotonic(), 0
        while not self.stopping.is_set():
            await asyncio.sleep(tick_s)
            owed = (time.monotonic() - started) * self.pace_per_s - sent
            for _ in range(int(owed)):
                self._submit(self.clients[sent % len(self.clients)])
                sent += 1

    def start(self) -> None:
        for g in range(self.gateways):
            client = Client(self.redis, f"synthetic-{g}-{secrets.token_hex(2)}", keys=self.keys)  # type: ignore[arg-type]
            client.on_answer = lambda answer, c=client: self._answer(c, answer)
            self.clients.append(client)
            self.tasks.append(asyncio.get_running_loop().create_task(client.run(self.stopping)))
            for _ in range(0 if self.pace_per_s else self.outstanding):
                self._submit(client)
        if self.pace_per_s:
            self.tasks.append(asyncio.get_running_loop().create_task(self._pace()))

    async def stop(self) -> None:
        """Ends the load by its event, not by cancelling (see `Client.run`)."""
        self.stopping.set()
        await asyncio.gather(*self.tasks)


async def _clean(redis, prefix: str) -> None:  # type: ignore[no-untyped-def]
    names = [key async for key in redis.scan_iter(match=f"{prefix}:*")]
    if names:
        await redis.delete(*names)


async def throughput(seconds: float, gateways: int, outstanding: int) -> dict[str, float]:
    redis = _redis()
    prefix = f"bench:shared:{secrets.token_hex(3)}"
    owner = _start_owner(prefix)
    redis_pid = int((await redis.info("server"))["process_id"])
    load = Load(redis, Keys(prefix), gateways, outstanding)
    try:
        load.start()
        warm_until = time.monotonic() + 30
        while load.done < gateways * outstanding:  # warmed up: every gateway's first round granted
            if time.monotonic() > warm_until:
                raise RuntimeError(f"warm-up stalled at {load.done} of {gateways * outstanding} granted")
            await asyncio.sleep(0.05)
        done0, wall0 = load.done, time.monotonic()
        cpu0 = (_cpu_s(owner.pid), time.process_time(), _cpu_s(redis_pid))
        await asyncio.sleep(seconds)
        done1, wall1 = load.done, time.monotonic()
        cpu1 = (_cpu_s(owner.pid), time.process_time(), _cpu_s(redis_pid))
        snapshot_bytes = await redis.hstrlen(Keys(prefix).snap, "state")
    finally:
        await load.stop()
        owner.terminate()
        owner.wait(timeout=10)
        await _clean(redis, prefix)
        await redis.aclose()
    elapsed = wall1 - wall0
    rate = (done1 - done0) / elapsed
    return {
        "requests_per_s": rate,
        "dispatcher_cores": (cpu1[0] - cpu0[0]) / elapsed,
        "load_generator_cores": (cpu1[1] - cpu0[1]) / elapsed,
        "redis_cores": (cpu1[2] - cpu0[2]) / elapsed,
        "dispatcher_us_per_request": 1e6 * (cpu1[0] - cpu0[0]) / max(done1 - done0, 1),
        "snapshot_bytes": snapshot_bytes,  # the engine's last snapshot (every SNAPSHOT_EVERY_S): what a standby loads
    }


async def gateway_peak(gateway: Server, seconds: float) -> tuple[float, float]:
    """One embedded gateway's peak (requests/s, the higher of 128 and 256 connections) and the load
    generator's cores at it."""
    rates, cores = [], []
    for connections in PEAK_CONNECTIONS:
        cpu0 = time.process_time()
        result = await closed_loop(_target(gateway), connections, seconds)
        rates.append(result.ok_per_s)
        cores.append((time.process_time() - cpu0) / seconds)
    best = max(range(len(rates)), key=rates.__getitem__)
    return rates[best], cores[best]


def _start_gateway(var_dir: Path) -> tuple[Server, Server]:
    sim = start_sim(var_dir, slots=1_000_000, fixed_latency_ms=BACKEND_LATENCY_MS)
    try:
        gateway = start_gateway(
            var_dir / "embedded",
            GATEWAY_YAML.format(url=sim.url),
            {"bench": ("bench", "INTERACTIVE")},
            name="embedded",
            FAIRGATE_BILLING="0",
            FAIRGATE_SCHEDULER="embedded",
            SECRET_KEY=secrets.token_hex(16),
        )
    except BaseException:
        sim.stop()
        raise
    return sim, gateway


async def _holder_pid(redis, prefix: str, owners: list[subprocess.Popen]) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    while True:
        token = await redis.get(f"{prefix}:lease")
        if token is not None:
            pid = int(token.decode().split(":")[-2])
            for process in owners:
                if process.pid == pid:
                    return process
        await asyncio.sleep(0.02)


async def takeovers(rounds: int, rate: float) -> list[float]:
    redis = _redis()
    prefix = f"bench:shared:{secrets.token_hex(3)}"
    keys = Keys(prefix)
    owners = [_start_owner(prefix), _start_owner(prefix)]
    for process in owners:
        await _ready(process)
    load = Load(redis, keys, gateways=2, outstanding=0, pace_per_s=rate)
    times_ms: list[float] = []
    try:
        load.start()
        for _ in range(rounds):
            give_up_s = time.monotonic() + READY_TIMEOUT_S
            while load.done < 200:
                if time.monotonic() > give_up_s:
                    raise RuntimeError(f"only {load.done} requests granted in {READY_TIMEOUT_S:.0f} s before a kill")
                await asyncio.sleep(0.05)
            holder = await _holder_pid(redis, prefix, owners)
            await asyncio.sleep(0.5)  # both running steadily
            killed_ms = time.time() * 1000
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
            owners.remove(holder)
            first_ms = None
            give_up_s = time.monotonic() + READY_TIMEOUT_S
            while first_ms is None:
                if time.monotonic() > give_up_s:
                    raise RuntimeError(f"no dispatcher took over within {READY_TIMEOUT_S:.0f} s of the SIGKILL")
                await asyncio.sleep(0.02)
                newer = await redis.xrange(keys.steps, min=f"{int(killed_ms) + 1}-0", count=1)
                if newer:
                    first_ms = int(newer[0][0].split(b"-")[0])
            times_ms.append(first_ms - killed_ms)
            owners.append(_start_owner(prefix))  # the next standby
            await _ready(owners[-1])
            load.done = 0
    finally:
        await load.stop()
        for process in owners:
            process.terminate()
            process.wait(timeout=10)
        await _clean(redis, prefix)
        await redis.aclose()
    return times_ms


async def main_async(args: argparse.Namespace) -> None:
    dispatcher: list[dict[str, float]] = []
    peaks: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        sim, gateway = _start_gateway(Path(tmp)) if args.rounds else (None, None)
        try:
            if gateway is not None:
                await closed_loop(_target(gateway), 32, 2.0)  # warm: connections, tokenizer
            for r in range(args.rounds):
                for part in ("gateway", "dispatcher") if r % 2 == 0 else ("dispatcher", "gateway"):
                    if part == "gateway":
                        assert gateway is not None
                        peaks.append(await gateway_peak(gateway, args.peak_s))
                    else:
                        dispatcher.append(await throughput(args.seconds, args.gateways, args.outstanding))
                print(f"round {r + 1}: dispatcher {dispatcher[-1]}, gateway {peaks[-1]}", file=sys.stderr, flush=True)
        finally:
            for server in (gateway, sim):
                if server is not None:
                    server.stop()
    for r, result in enumerate(dispatcher):
        print(
            f"round {r + 1}: dispatcher alone {result['requests_per_s']:.0f} requests/s "
            f"(submit -> grant -> completion; {args.gateways} synthetic gateways x {args.outstanding} in flight); "
            f"dispatcher {result['dispatcher_cores']:.2f} cores "
            f"({result['dispatcher_us_per_request']:.1f} µs per request), "
            f"load generator {result['load_generator_cores']:.2f}, Redis {result['redis_cores']:.2f}; "
            f"last snapshot {result['snapshot_bytes']:,} bytes; "
            f"one embedded gateway's peak {peaks[r][0]:.0f}/s (load generator {peaks[r][1]:.2f} cores)"
        )
    if dispatcher:
        rate, peak = mean(d["requests_per_s"] for d in dispatcher), mean(p[0] for p in peaks)
        print(f"dispatcher {rate:.0f}/s against one gateway's peak {peak:.0f}/s: {rate / peak:.1f}x (target >= 20x)")
    if args.takeovers:
        times = await takeovers(args.takeovers, args.takeover_rate)
        shown = ", ".join(f"{t:.0f}" for t in times)
        print(
            f"takeover after SIGKILL of the lease holder (lease {LEASE_MS} ms, "
            f"load {args.takeover_rate:.0f} requests/s): {shown} ms; max {max(times):.0f} ms"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shared_dispatcher", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--gateways", type=int, default=4)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="dispatcher and gateway peak, alternated")
    parser.add_argument("--peak-s", type=float, default=6.0, help="seconds per connection count of the gateway peak")
    parser.add_argument("--takeovers", type=int, default=5)
    parser.add_argument("--takeover-rate", type=float, default=2000.0, help="requests/s during the takeovers")
    parser.add_argument("--owner", help=argparse.SUPPRESS)  # internal: run one dispatcher process
    args = parser.parse_args(argv)
    if args.owner:
        serve_owner(args.owner)
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
