"""A small, fast HTTP/1.1 load generator on raw asyncio streams (keep-alive, no client library).

Two ways to drive a server with one pre-built request:

* ``open_loop``: arrivals at a fixed mean rate (Poisson, seeded) for a duration; each latency is
  measured from the arrival's *scheduled* time, so a generator or server that falls behind shows
  up in the latencies instead of silently lowering the rate (no coordinated omission);
* ``closed_loop``: ``concurrency`` workers, each sending its next request as soon as the last one
  answered, for a duration: the server's saturated throughput.

A new connection is opened whenever no idle one is left (up to ``max_connections``; past that
an arrival waits for one, which its latency then includes). The generator reports its own
achieved send rate and how late it sent (``send_lag``), so a generator that is the bottleneck
is visible.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from bench import rawhttp  # the one raw HTTP/1.1 client of the benchmarks (and its pool)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, base_url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> Target:
        host, port = rawhttp.split_url(base_url)
        return cls(host, port, path, body, tuple((headers or {}).items()))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request_bytes(self) -> bytes:
        return rawhttp.request_bytes(self.host, self.port, self.path, self.body, dict(self.headers))


@dataclass
class Result:
    """What one run measured. Latencies in ms, only of requests answered with 2xx."""

    offered_per_s: float
    duration_s: float
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    connections: int = 0
    elapsed_s: float = 0.0  # from the first send to the last answer

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def sent_per_s(self) -> float:
        return self.sent / self.duration_s if self.duration_s else 0.0

    @property
    def ok_per_s(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s else 0.0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[rank]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; returns (status, keep-alive)."""
    head = await rawhttp.read_head(reader)
    await rawhttp.read_body(reader, head)
    return head.status, head.keep_alive


async def _one(pool: rawhttp.Pool, payload: bytes, result: Result, scheduled_s: float, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    result.send_lag_ms.append((loop.time() - scheduled_s) * 1000.0)  # the generator's own lateness
    try:
        pair = await pool.take()
    except OSError:
        result.error("connect")
        return
    reusable = False
    try:
        pair[1].write(payload)
        status, reusable = await asyncio.wait_for(_read_response(pair[0]), timeout_s)
        if 200 <= status < 300:
            result.ok += 1
            result.latencies_ms.append((loop.time() - scheduled_s) * 1000.0)
        else:
            result.error(str(status))
    except TimeoutError:
        result.error("timeout")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        result.error("io")
    finally:
        pool.give_back(pair, reusable=reusable)


async def open_loop(
    target: Target,
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int = 1,
    max_connections: int = 2000,
    timeout_s: float = 30.0,
) -> Result:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``; waits for the stragglers."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    pool = rawhttp.Pool(target.base_url, max_connections=max_connections)
    payload = target.request_bytes()
    result = Result(offered_per_s=rate_per_s, duration_s=duration_s)
    tasks: set[asyncio.Task[None]] = set()
    start_s = loop.time()
    due_s = start_s
    end_s = start_s + duration_s
    while True:
        due_s += rng.expovariate(rate_per_s)
        if due_s >= end_s:
            break
        delay_s = due_s - loop.time()
        if delay_s > 0.0005:
            await asyncio.sleep(delay_s)
        task = loop.create_task(_one(pool, payload, result, due_s, timeout_s))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        result.sent += 1
    if tasks:
        await asyncio.wait(set(tasks))
    result.elapsed_s = loop.time() - start_s
    result.connections = pool.opened
    pool.close()
    return result


async def closed_loop(target: Target, concurrency: int, duration_s: float, *, timeout_s: float = 30.0) -> Result:
    """``concurrency`` back-to-back senders for ``duration_s``: throughput at saturation."""
    loop = asyncio.get_running_loop()
    pool = rawhttp.Pool(target.base_url, max_connections=concurrency)
    payload = target.request_bytes()
    result = Result(offered_per_s=0.0, duration_s=duration_s)
    start_s = loop.time()
    end_s = start_s + duration_s

    async def worker() -> None:
        while loop.time() < end_s:
            result.sent += 1
            await _one(pool, payload, result, loop.time(), timeout_s)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.elapsed_s = loop.time() - start_s
    result.connections = pool.opened
    pool.close()
    return result
