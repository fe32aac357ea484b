"""The surge's HTTP batch sent from a process of its own (bench.surge.batch_sender): a real child
process sends the batch to a small HTTP server in this test, and its outcomes reach the parent's
ledger. The test waits for states (every request answered), never for a time."""

from __future__ import annotations

import asyncio
import json

from bench.surge import SurgePlan
from bench.surge.batch_sender import BatchSender, plan_from_json, plan_json
from bench.surge.plan import Prompts
from bench.surge.traffic import OK, Clock, Ledger, batch_bodies

WAIT_S = 120.0  # a bound for a machine that has stopped, not the expected time


def test_a_plan_goes_to_the_child_and_comes_back_the_same():
    plan = SurgePlan(batch_count=7, time_scale=33.0, load_scale=0.5, patience_sim_s=(5.0, 9.0), seed=4)
    assert plan_from_json(plan_json(plan)) == plan


class _Server:
    """Answers every request 200 (or 429 for every third body seen), keeping each body it got."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                raw = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in raw.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = json.loads(await reader.readexactly(length))
                self.bodies.append(body)
                refused = len(self.bodies) % 3 == 0
                status, answer = (
                    ("429 Too Many Requests", b'{"error": {"code": "queue_full"}}') if refused else ("200 OK", b"{}")
                )
                head = f"HTTP/1.1 {status}\r\nContent-Length: {len(answer)}\r\nContent-Type: application/json\r\n\r\n"
                writer.write(head.encode() + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def test_the_batch_sent_by_its_own_process_lands_in_the_replays_ledger_sent_after_0900():
    plan = SurgePlan(batch_count=30, time_scale=3000.0, batch_spread_sim_s=30.0)

    async def run() -> tuple[Ledger, list[dict]]:
        server = _Server()
        base_url = await server.start()
        process = BatchSender(plan, base_url, "sk-finance")
        await process.start()
        clock, ledger = Clock(plan), Ledger()
        process.go(clock, ledger)
        try:
            async with asyncio.timeout(WAIT_S):
                while sum(o.done_sim_s is not None for o in ledger.of("batch")) < plan.batch_count:
                    await asyncio.sleep(0.05)
        finally:
            await process.stop()
            server.server.close()
        assert process.proc.returncode == 0
        return ledger, server.bodies

    ledger, bodies = asyncio.run(run())
    batch = ledger.of("batch")
    assert len(batch) == ledger.batch_sent == plan.batch_count
    assert min(o.sent_sim_s for o in batch) >= plan.warmup_sim_s  # nothing before 09:00 on the replay's clock
    assert sorted(json.dumps(b, sort_keys=True) for b in bodies) == sorted(
        json.dumps(b, sort_keys=True) for b in batch_bodies(plan, Prompts(plan.seed))
    )
    refused = [o for o in batch if o.state != OK]
    assert len(refused) == plan.batch_count // 3 and {o.code for o in refused} == {"queue_full"}


def test_a_replay_stopped_before_0900_sends_nothing_and_its_process_ends():
    plan = SurgePlan(batch_count=5, time_scale=1.0)  # 09:00 is five real minutes away

    async def run() -> tuple[Ledger, int | None]:
        server = _Server()
        base_url = await server.start()
        process = BatchSender(plan, base_url, "sk-finance")
        await process.start()
        ledger = Ledger()
        process.go(Clock(plan), ledger)
        await process.stop()
        server.server.close()
        return ledger, process.proc.returncode

    ledger, code = asyncio.run(run())
    assert ledger.of("batch") == [] and code == 0
