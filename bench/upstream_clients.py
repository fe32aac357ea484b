"""Why Fairgate has its own small HTTP/1.1 client upstream: its cost beside httpx and aiohttp.

    .venv/bin/python -m bench.upstream_clients [--requests 4000] [--concurrency 64] [--rounds 3]

One simulated backend (``simbackend``, a process of its own, answering each chat request after 1 ms
with a small JSON body); each client sends the same non-streaming chat request ``--requests``
times at ``--concurrency`` in flight, on keep-alive connections, from this process on uvloop
(the gateway's loop). The clients take turns, the order rotating each round. Reported per client:
this process's CPU per request (what the gateway's event loop would pay per upstream call) and
the requests per second it reached, each the median over the rounds, and its ratio to
Fairgate's client. The simulator's own CPU is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import uvloop

from bench.launch import start_sim
from gateway.upstream import Pool

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
HEADERS = {"Content-Type": "application/json"}
PATH = "/v1/chat/completions"
Send = Callable[[], Awaitable[int]]  # one request: its status


async def _fairgate(url: str, concurrency: int):
    pool = Pool(url, connect_timeout_s=5, read_timeout_s=30, max_idle=concurrency)

    async def send() -> int:
        response = await pool.post(PATH, BODY, HEADERS)
        await response.aread()
        await response.aclose()
        return response.status_code

    return send, pool.close


async def _httpx(url: str, concurrency: int):
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(base_url=url, limits=limits, timeout=30)

    async def send() -> int:
        response = await client.post(PATH, content=BODY, headers=HEADERS)
        return response.status_code

    return send, client.aclose


async def _aiohttp(url: str, concurrency: int):
    session = aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=concurrency))

    async def send() -> int:
        async with session.post(PATH, data=BODY, headers=HEADERS) as response:
            await response.read()
            return response.status

    return send, session.close


CLIENTS = {"fairgate": _fairgate, "httpx": _httpx, "aiohttp": _aiohttp}


async def run_one(make, url: str, requests: int, concurrency: int) -> tuple[float, float, int]:
    """(CPU ms per request, requests per second, failures) of one client."""
    send, close = await make(url, concurrency)
    try:
        for _ in range(concurrency):  # warm: open the connections
            await send()
        remaining = requests
        failures = 0

        async def worker() -> None:
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                try:
                    if await send() != 200:
                        failures += 1
                except Exception:
                    failures += 1

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        result = close()
        if asyncio.iscoroutine(result):
            await result
    return 1000 * cpu / requests, requests / wall, failures


async def measure(url: str, requests: int, concurrency: int, rounds: int) -> dict[str, list[tuple[float, float, int]]]:
    names = list(CLIENTS)
    found: dict[str, list[tuple[float, float, int]]] = {name: [] for name in names}
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            found[name].append(await run_one(CLIENTS[name], url, requests, concurrency))
            cpu, rate, failed = found[name][-1]
            print(
                f"round {index + 1} {name:>8}: {cpu:.3f} ms CPU per request, {rate:,.0f}/s, {failed} failed",
                file=sys.stderr,
            )
    return found


def render(found: dict[str, list[tuple[float, float, int]]], requests: int, concurrency: int, rounds: int) -> str:
    median = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), sum(r[2] for r in runs))
        for name, runs in found.items()
    }
    base_cpu, base_rate, _ = median["fairgate"]
    lines = [
        f"{requests} requests per run at {concurrency} in flight, {rounds} rounds (medians):",
        "",
        "| client | CPU per request | × Fairgate's | requests/s | × Fairgate's | failed |",
        "|---|---|---|---|---|---|",
    ]
    for name, (cpu, rate, failed) in median.items():
        lines.append(
            f"| {name} | {cpu:.3f} ms | {cpu / base_cpu:.2f} | {rate:,.0f} | {rate / base_rate:.2f} | {failed} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.upstream_clients",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--requests, --concurrency and --rounds must be at least 1")
    sim = start_sim(Path(tempfile.mkdtemp(prefix="fairgate-clients-")), slots=1_000_000, fixed_latency_ms=1)
    try:
        found = uvloop.run(measure(sim.url, args.requests, args.concurrency, args.rounds))
    finally:
        sim.stop()
    print(render(found, args.requests, args.concurrency, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
