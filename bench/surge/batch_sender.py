"""The HTTP batch, sent from a process of its own.

The finance batch opens up to 2,000 connections within a real second or two. Sent from the
replay's own event loop, that work delayed the loop that times every chat: in the field-size
run the loop woke up to 298 ms late in the flood's window, and each chat counted that delay
(times the time scale) as the gateway's. The finance job does not run on the chat users'
machines either. So the replay starts this module as a child process:

* the child builds the batch's requests (``batch_payloads``) and says ``ready``;
* the parent starts its clock and writes the clock's start (``time.monotonic()``, which is the
  same clock in both processes); the child sends the batch from 09:00 on that clock;
* the child writes each batch outcome as a JSON line when it is sent and again when it ends
  (``[index, sent_sim_s, state, code, ttft_sim_s, done_sim_s]``), a few times a real second;
  the parent keeps them in its ledger, so the timeline counts the batch as before;
* the parent writes ``stop``; the child cancels what is still open, writes the last outcomes and
  ``end``, and exits.

The child is ``python -m bench.surge.batch_child --gateway URL --key KEY --plan JSON`` (only the
replay starts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from bench.surge.plan import SurgePlan
from bench.surge.traffic import Clock, Ledger, Outcome

READY, END, STOP = b"ready\n", b"end\n", b"stop\n"
REPO_ROOT = Path(__file__).resolve().parents[2]


def plan_json(plan: SurgePlan) -> str:
    return json.dumps(dataclasses.asdict(plan))


def plan_from_json(text: str) -> SurgePlan:
    fields = json.loads(text)
    return SurgePlan(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def row(index: int, outcome: Outcome) -> list:
    """One outcome as the child writes it (a JSON line); ``BatchSender.apply`` reads it."""
    return [index, outcome.sent_sim_s, outcome.state, outcome.code, outcome.ttft_sim_s, outcome.done_sim_s]


class BatchSender:
    """The batch's process, seen from the replay: ``start`` (the requests are built), ``go``
    (the clock has started; outcomes flow into ``ledger``), ``stop`` (every outcome is in)."""

    def __init__(self, plan: SurgePlan, base_url: str, key: str) -> None:
        self.plan, self.base_url, self.key = plan, base_url, key
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task | None = None
        self.outcomes: dict[int, Outcome] = {}

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.surge.batch_child",
            "--gateway",
            self.base_url,
            "--key",
            self.key,
            "--plan",
            plan_json(self.plan),
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        said = await self.proc.stdout.readline()
        if said != READY:
            await self.proc.wait()
            raise RuntimeError(f"the batch sender did not start (exit {self.proc.returncode}, said {said!r})")

    def go(self, clock: Clock, ledger: Ledger) -> None:
        self.proc.stdin.write(f"{clock.start_real_s!r}\n".encode())
        self.reader = asyncio.get_running_loop().create_task(self._read(ledger))

    async def _read(self, ledger: Ledger) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line or line == END:
                return
            self.apply(json.loads(line), ledger)

    def apply(self, row: list, ledger: Ledger) -> None:
        index, sent_sim_s, state, code, ttft_sim_s, done_sim_s = row
        outcome = self.outcomes.get(index)
        if outcome is None:
            outcome = self.outcomes[index] = Outcome("batch", sent_sim_s)
            ledger.add(outcome)
            ledger.batch_sent += 1
        outcome.state, outcome.code, outcome.ttft_sim_s, outcome.done_sim_s = state, code, ttft_sim_s, done_sim_s

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Asks the child to stop and waits for its last outcomes; kills it if it does not answer."""
        if self.proc is None:
            return
        with contextlib.suppress(ConnectionError):
            self.proc.stdin.write(STOP)
            await self.proc.stdin.drain()
        try:
            if self.reader is not None:
                await asyncio.wait_for(self.reader, timeout_s)
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            if self.reader is not None:
                self.reader.cancel()
