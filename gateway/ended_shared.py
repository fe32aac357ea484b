"""Finished requests seen by every gateway process (the shared scheduler's terminal log).

Each process appends the records of the requests it ends to one Redis stream (``<prefix>:ended``,
msgpack batches of `APPEND_LINGER_MS`, field ``b``; a one-record JSON entry is still read) and
follows that stream into its own terminal log, reading the last ``FAIRGATE_TERMINAL_KEEP_MS`` at
start, so ``GET /v1/queue/{id}`` answers alike through every process. A record that cannot be
appended stays in its own process's log. Why the batching: docs/shared-scheduler.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import msgpack

from scheduling.shared.bell import sleep_or

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)
READ_BLOCK_MS = 1_000
READ_COUNT = 1_000
APPEND_LINGER_MS = 50  # the records ended within this go in one entry
FOLLOW_PAUSE_MS = 50  # after a read that found entries, the next read waits this long
Add = Callable[[str, str, dict, int], None]  # (tenant, public id, record, ended at ms) -> the local log
Read = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]  # XREAD's answer (no decoding)


class EndedStream:
    def __init__(self, redis: Redis, key: str, *, gateway: str, keep_ms: int, max_entries: int) -> None:
        self.redis = redis
        self.key = key
        self.gateway = gateway.encode()
        self.keep_ms = keep_ms
        self.max_entries = max_entries
        self._pending: list[list[Any]] = []
        self._flush: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def publish(self, tenant: str, public_id: str, record: dict) -> None:
        """Appends ``record`` soon (with the others ended within `APPEND_LINGER_MS`); never waits."""
        self._pending.append([tenant, public_id, record])
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(APPEND_LINGER_MS / 1000, self._send)

    def _send(self) -> None:
        self._flush = None
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._append(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _append(self, batch: list[list[Any]]) -> None:
        try:
            # MAXLEN counts entries, each a turn's batch: about max_entries records or more are kept
            fields = {b"g": self.gateway, b"b": msgpack.packb(batch)}
            await self.redis.xadd(self.key, fields, maxlen=self.max_entries, approximate=True)  # type: ignore[arg-type]
        except Exception as failed:  # Redis out of reach: the records stay in this process's log
            log.warning("could not share %d finished requests with the other processes: %r", len(batch), failed)

    async def follow(self, add: Add, *, now_ms: int, stop: asyncio.Event) -> None:
        """Adds the other processes' records to this one's log (``add``): first those of the last
        ``keep_ms``, then each as it comes, until ``stop``."""
        last = f"{max(0, now_ms - self.keep_ms)}-0"
        while not stop.is_set():
            try:
                found = cast(Read, await self.redis.xread({self.key: last}, count=READ_COUNT, block=READ_BLOCK_MS))
            except Exception as failed:
                log.warning("could not read the other processes' finished requests: %r", failed)
                await asyncio.sleep(1)
                continue
            for _key, entries in found or ():
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    if fields.get(b"g") != self.gateway:
                        _add_all(add, fields, int(last.split("-", 1)[0]))
            if found:  # what is appended meanwhile comes in one read
                await sleep_or(stop, FOLLOW_PAUSE_MS / 1000)

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._send()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


def _add_all(add: Add, fields: dict[bytes, bytes], ended_ms: int) -> None:
    """The records of one entry, to the local log; an entry that cannot be read is logged and skipped."""
    try:
        packed = fields.get(b"b")
        if packed is None:  # one JSON record (the format before the batches)
            records = [[fields[b"t"].decode(), fields[b"p"].decode(), json.loads(fields[b"r"])]]
        else:
            records = msgpack.unpackb(packed, strict_map_key=False)
        for tenant, public_id, record in records:
            add(tenant, public_id, record, ended_ms)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as bad:
        log.warning("skipping an unreadable record of the other processes' finished requests: %r", bad)
