"""The surge's HTTP batch sender, the child process of bench.surge.batch_sender (which says why
and how the two talk): builds the batch's requests, says ``ready``, reads the replay's clock start,
sends the batch from 09:00 on that clock, writes each outcome as a JSON line, and at ``stop`` (or
when the replay has gone) cancels what is still open, writes the last outcomes and ``end``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading

from bench.surge.batch_sender import END, READY, plan_from_json, row
from bench.surge.plan import SurgePlan
from bench.surge.traffic import Clock, Ledger, Outcome, Traffic, batch_payloads, run_sync

FLUSH_S = 0.05  # real seconds between writes of outcomes


class _Writer:
    """Outcomes written to stdout as JSON lines every ``FLUSH_S`` (not one write each)."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}  # id(outcome) -> its index
        self.lines: list[bytes] = []

    def __call__(self, outcome: Outcome) -> None:
        index = self.index.setdefault(id(outcome), len(self.index))
        self.lines.append(json.dumps(row(index, outcome)).encode() + b"\n")

    def flush(self) -> None:
        if self.lines:
            sys.stdout.buffer.write(b"".join(self.lines))
            self.lines.clear()
        sys.stdout.buffer.flush()

    async def every(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()


async def _send(plan: SurgePlan, base_url: str, payloads: list[bytes], start_real_s: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:  # "stop", or the parent gone (EOF)
        sys.stdin.buffer.readline()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    clock = Clock(plan, start_real_s)
    writer = _Writer()
    traffic = Traffic(plan, base_url, clock, Ledger(listener=writer))
    flusher = loop.create_task(writer.every())
    sending = None
    waiting = loop.create_task(stop.wait())
    try:
        while not stop.is_set() and clock.now_sim_s() < plan.warmup_sim_s:  # (a timer may fire a little early)
            await asyncio.wait([waiting], timeout=max(0.001, plan.real_s(plan.warmup_sim_s - clock.now_sim_s())))
        if not stop.is_set():
            sending = loop.create_task(traffic.batch(payloads))
            await waiting  # the replay stops it, whether or not every request has ended
    finally:
        waiting.cancel()
        if sending is not None:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
        await traffic.close()
        flusher.cancel()
        writer.flush()
        sys.stdout.buffer.write(END)
        sys.stdout.buffer.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.surge.batch_child", description=__doc__)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--plan", required=True, help="the SurgePlan as JSON")
    args = parser.parse_args(argv)
    plan = plan_from_json(args.plan)
    payloads = batch_payloads(plan, args.gateway, args.key)
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    start = sys.stdin.buffer.readline()
    if not start.strip():
        return 1  # the parent went away before its clock started
    run_sync(_send(plan, args.gateway, payloads, float(start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
