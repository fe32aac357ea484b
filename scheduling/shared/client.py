"""A gateway's end of the shared dispatcher: it sends commands, reads its answers, and beats.

Commands are appended to the command stream in the order `send` was called: what one turn of
the event loop sends goes in one stream entry (`protocol.pack`; `protocol.BATCH_MAX` commands at
most, more entries in one pipeline for more), after the previous one has gone (one flush at a
time). Answers arrive on the gateway's own list, one element per commit of the dispatcher, read
by `run` until stopped (a blocking pop, then whatever else has arrived) and handed to
``on_answer`` in order; `run` also beats between reads. The heartbeat (``gw:<gateway>``, with a time
to live) tells the dispatcher the gateway's requests still have someone waiting for them; with each
beat ``on_beat`` runs (the gateway renews its running requests' leases there: a ``renew`` command).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import redis.asyncio

from scheduling.shared.bell import sleep_or
from scheduling.shared.lease import GATEWAY_TTL_MS
from scheduling.shared.protocol import BATCH_MAX, Answer, Command, answers_of, pack
from scheduling.shared.replica import Keys

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)
READ_BLOCK_S = 1
READ_MORE = 1000  # elements per read (each one commit's answers)
BEAT_EVERY_S = 1.0
RETRY_S = 0.5


def connect(url: str) -> Redis:
    """The client the shared scheduler runs on: bytes (no decoding), and a socket timeout above the
    longest blocking read here (one second), so a dead server shows without hanging a read."""
    return redis.asyncio.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


class Client:
    def __init__(self, redis: Redis, gateway: str, *, keys: Keys | None = None) -> None:
        self.redis = redis
        self.gateway = gateway
        self.keys = keys or Keys()
        self.on_answer: Callable[[Answer], None] = lambda answer: None
        self.on_beat: Callable[[], None] = lambda: None
        self._pending: list[Command] = []
        self._flushing: asyncio.Task[None] | None = None
        self._out = self.keys.out(gateway)
        self.last_sent: bytes | None = None  # the stream id of the last command sent
        self._beaten = False  # a heartbeat went before the first command (else the dispatcher may find none)

    @property
    def idle(self) -> bool:
        """Nothing sent is still on its way to the stream."""
        return not self._pending and self._flushing is None

    # --- commands ------------------------------------------------------------------------------

    def send(self, command: Command) -> None:
        """Queues ``command``; it goes with the others of this turn, in order."""
        self._pending.append(command)
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Sends what is pending, in order; a batch Redis did not take is sent again (after a
        pause), before anything sent since: commands are never lost or reordered while the
        process lives."""
        try:
            while self._pending:  # a task's first step runs a turn later: this turn's commands are all here
                batch, self._pending = self._pending, []
                try:
                    if not self._beaten:
                        await self.beat()
                    if len(batch) <= BATCH_MAX:
                        sent = await self.redis.xadd(self.keys.cmds, {"m": pack(batch)})
                        self.last_sent = cast(bytes, sent)  # bytes: the client does not decode
                    else:
                        pipe = self.redis.pipeline(transaction=False)
                        for at in range(0, len(batch), BATCH_MAX):
                            pipe.xadd(self.keys.cmds, {"m": pack(batch[at : at + BATCH_MAX])})
                        self.last_sent = (await pipe.execute())[-1]
                except Exception as failed:  # Redis out of reach
                    log.warning(
                        "gateway %s could not send %d commands (%r); retrying", self.gateway, len(batch), failed
                    )
                    self._pending = batch + self._pending
                    await asyncio.sleep(RETRY_S)
        finally:
            self._flushing = None

    async def flushed(self) -> None:
        """Returns once everything sent so far is in the stream."""
        while self._flushing is not None:
            await asyncio.shield(self._flushing)

    # --- answers -------------------------------------------------------------------------------

    async def answers(self, *, block_s: float | None = READ_BLOCK_S) -> list[Answer]:
        """What has arrived for this gateway (waiting up to ``block_s`` for the first; None: not
        at all): one BLMPOP takes up to `READ_MORE` at once."""
        if block_s is None:
            raws = await self.redis.lpop(self._out, READ_MORE) or []
        else:
            found = await self.redis.blmpop(block_s, 1, self._out, direction="LEFT", count=READ_MORE)
            raws = found[1] if found else []
        return [answer for raw in cast("list[bytes]", raws) for answer in answers_of(raw)]  # bytes: no decoding

    def deliver(self, answers: list[Answer]) -> None:
        """Hands answers to ``on_answer`` in order (those read here, and those the owner of this
        process's dispatcher role hands over in process)."""
        for answer in answers:
            try:
                self.on_answer(answer)
            except Exception:
                log.exception("answer %r could not be handled", answer)

    async def beat(self) -> None:
        await self.redis.set(self.keys.gateway(self.gateway), b"1", px=GATEWAY_TTL_MS)
        self._beaten = True

    def _on_beat(self) -> None:
        try:
            self.on_beat()
        except Exception:
            log.exception("gateway %s: what runs with its heartbeat failed", self.gateway)

    async def run(self, stop: asyncio.Event) -> None:
        """Reads answers, and beats between reads, until ``stop`` is set; it ends within one
        blocking read (`READ_BLOCK_S`). Stopped by an event, not by cancelling: on Python 3.11 a
        redis-py command whose reply arrives as it is cancelled returns the reply and drops the
        cancellation (``asyncio.wait_for`` under the socket timeout, CPython gh-86296), so a loop
        that is only cancelled may run on for good."""
        beat_at = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= beat_at:
                    await self.beat()
                    beat_at = time.monotonic() + BEAT_EVERY_S
                    self._on_beat()
                answers = await self.answers()
            except Exception as failed:  # Redis out of reach: what is on the list waits there
                log.warning("gateway %s could not reach Redis (%r); retrying", self.gateway, failed)
                await sleep_or(stop, RETRY_S)
                continue
            self.deliver(answers)
