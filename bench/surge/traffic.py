"""The replay's clients: chat (streaming, with patience), near-RT and the batch submitter.

Each request leaves one ``Outcome``: when it was sent (simulated seconds since the replay
started), how it ended, and for chat the time to first token in simulated seconds.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bench import rawhttp
from bench.surge.plan import BATCH, CHAT, NEAR_RT, Prompts, Shape, SurgePlan

OK, GAVE_UP, ERROR = "ok", "gave_up", "error"


@dataclass
class Outcome:
    kind: str  # chat | near_rt | batch
    sent_sim_s: float
    state: str = "pending"  # ok | gave_up | error | pending
    code: str = ""  # error code or HTTP status of a failure
    ttft_sim_s: float | None = None  # chat: first token; others: whole response
    done_sim_s: float | None = None


@dataclass
class Ledger:
    """Everything the clients observed, appended as it happens. ``listener`` (if any) is told of
    each outcome added and of each that ended (the batch sender's process passes them on)."""

    outcomes: list[Outcome] = field(default_factory=list)
    batch_sent: int = 0  # batch requests handed to the gateway so far (connections opened)
    listener: Callable[[Outcome], None] | None = None

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.listener is not None:
            self.listener(outcome)

    def ended(self, outcome: Outcome) -> None:
        if self.listener is not None:
            self.listener(outcome)


class Clock:
    """Simulated seconds since the replay started, on the machine's monotonic clock, so that
    another process given ``start_real_s`` keeps the same time (bench.surge.batch_sender)."""

    def __init__(self, plan: SurgePlan, start_real_s: float | None = None) -> None:
        self.plan = plan
        self.start_real_s = time.monotonic() if start_real_s is None else start_real_s

    def now_sim_s(self) -> float:
        return self.plan.sim_s(time.monotonic() - self.start_real_s)

    async def sleep_until_sim(self, sim_s: float) -> None:
        delay = self.start_real_s + self.plan.real_s(sim_s) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def _body(plan: SurgePlan, prompts: Prompts, shape: Shape, rng: random.Random, *, stream: bool) -> dict:
    body = {
        "model": plan.model,
        "messages": [{"role": "user", "content": prompts.text(rng.randint(*shape.prompt_tokens))}],
        "max_tokens": rng.randint(*shape.max_tokens),
    }
    if stream:
        body["stream"] = True
    return body


def batch_bodies(plan: SurgePlan, prompts: Prompts) -> Iterator[dict]:
    """The finance batch's ``batch_count`` request bodies, in order: the same ones whether they are
    sent over HTTP (``Traffic.batch``) or uploaded as a file (bench.surge.upload)."""
    rng = random.Random(plan.seed + 7)
    for _ in range(plan.batch_count):
        yield _body(plan, prompts, BATCH, rng, stream=False)


def _payload(host: str, port: int, key: str, body: dict, cls: str) -> bytes:
    headers = {"Authorization": f"Bearer {key}", "X-Priority-Class": cls}
    return rawhttp.request_bytes(host, port, "/v1/chat/completions", json.dumps(body).encode(), headers)


def batch_payloads(plan: SurgePlan, base_url: str, key: str) -> list[bytes]:
    """The batch's HTTP requests, whole, made before the replay's clock starts. Made as they were
    sent, the 12,400 bodies of ~17 KB each (210 MB) cost this process's event loop about a second
    of CPU within the flood's first real seconds, and every chat timed meanwhile counted its delays
    (times the time scale) as the gateway's."""
    host, port = rawhttp.split_url(base_url)
    return [_payload(host, port, key, body, "BATCH") for body in batch_bodies(plan, Prompts(plan.seed))]


class Traffic:
    def __init__(self, plan: SurgePlan, base_url: str, clock: Clock, ledger: Ledger) -> None:
        self.plan = plan
        self.clock = clock
        self.ledger = ledger
        self.prompts = Prompts(plan.seed)
        self.tasks: set[asyncio.Task] = set()
        self.pool = rawhttp.Pool(base_url)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.pool.close()

    def _request(self, key: str, body: dict, cls: str) -> bytes:
        return _payload(self.pool.host, self.pool.port, key, body, cls)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- open-loop arrivals of chat and near-RT ------------------------------------------

    async def arrivals(
        self, kind: str, rate_per_real_s: float, keys: list[str], stop: asyncio.Event, seed: int
    ) -> None:
        rng = random.Random(seed)
        due_sim_s = 0.0
        while not stop.is_set():
            due_sim_s += self.plan.sim_s(rng.expovariate(rate_per_real_s))
            await self.clock.sleep_until_sim(due_sim_s)
            if stop.is_set():
                return
            key = rng.choice(keys)
            if kind == "chat":
                patience_sim_s = rng.uniform(*self.plan.patience_sim_s)
                body = _body(self.plan, self.prompts, CHAT, rng, stream=True)
                self._spawn(self._chat(key, body, patience_sim_s))
            else:
                body = _body(self.plan, self.prompts, NEAR_RT, rng, stream=False)
                self._spawn(self._plain("near_rt", self._request(key, body, "NEAR_RT")))

    async def _chat(self, key: str, body: dict, patience_sim_s: float) -> None:
        """Streaming chat; the user leaves (closes the connection) after ``patience_sim_s``."""
        outcome = Outcome("chat", self.clock.now_sim_s())
        self.ledger.add(outcome)
        payload = self._request(key, body, "INTERACTIVE")
        conn, reusable = None, False
        try:
            async with asyncio.timeout(self.plan.real_s(patience_sim_s)):
                conn = await self.pool.take()
                conn[1].write(payload)
                head = await rawhttp.read_head(conn[0])
                if head.status != 200:
                    content = await rawhttp.read_body(conn[0], head)
                    outcome.state, outcome.code = ERROR, rawhttp.error_code(head.status, content)
                    reusable = head.keep_alive
                    return
                async for _ in rawhttp.iter_body(conn[0], head):
                    if outcome.ttft_sim_s is None:
                        outcome.ttft_sim_s = self.clock.now_sim_s() - outcome.sent_sim_s
                reusable = head.keep_alive
            outcome.state = OK
        except TimeoutError:
            if outcome.ttft_sim_s is None:
                outcome.state, outcome.ttft_sim_s = GAVE_UP, patience_sim_s
            else:
                outcome.state = OK  # got its first token in time; the rest was cut short
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            outcome.state, outcome.code = ERROR, type(exc).__name__
        finally:
            outcome.done_sim_s = self.clock.now_sim_s()
            if conn is not None:
                self.pool.give_back(conn, reusable=reusable and outcome.state != GAVE_UP)

    async def _plain(self, kind: str, payload: bytes) -> None:
        outcome = Outcome(kind, self.clock.now_sim_s())
        self.ledger.add(outcome)
        conn, reusable = None, False
        try:
            conn = await self.pool.take()
            conn[1].write(payload)
            head = await rawhttp.read_head(conn[0])
            content = await rawhttp.read_body(conn[0], head)
            reusable = head.keep_alive
            if head.status == 200:
                outcome.state = OK
                outcome.ttft_sim_s = self.clock.now_sim_s() - outcome.sent_sim_s
            else:
                outcome.state, outcome.code = ERROR, rawhttp.error_code(head.status, content)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            outcome.state, outcome.code = ERROR, type(exc).__name__
        finally:
            outcome.done_sim_s = self.clock.now_sim_s()
            self.ledger.ended(outcome)
            if conn is not None:
                self.pool.give_back(conn, reusable=reusable)

    # --- the batch ------------------------------------------------------------------------

    async def batch(self, payloads: list[bytes]) -> None:
        """All ``batch_count`` requests (`batch_payloads`) at once; at most ``max_open_batch``
        connections are open, the rest wait in this process for one (they reach the gateway's queue
        as others finish). The replay runs this in a process of its own (bench.surge.batch_sender)."""
        gate = asyncio.Semaphore(self.plan.max_open_batch)

        async def one(payload: bytes) -> None:
            async with gate:
                self.ledger.batch_sent += 1
                await self._plain("batch", payload)

        loop = asyncio.get_running_loop()
        pending = []
        start_sim_s = self.clock.now_sim_s()
        gap_sim_s = self.plan.batch_spread_sim_s / self.plan.batch_count
        for index, payload in enumerate(payloads):
            pending.append(loop.create_task(one(payload)))
            if index % 50 == 49:  # evenly over the spread (and never blocking the loop for long)
                await self.clock.sleep_until_sim(start_sim_s + (index + 1) * gap_sim_s)
        await asyncio.gather(*pending)


def run_sync(coro):
    """Run ``coro`` on uvloop when installed (a cheaper client), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
