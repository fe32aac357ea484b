"""Predicted admission's demand profile (``DemandProfile``) kept in the database, so that a restarted
gateway admits by what the days before taught its engine (docs/engine.md, "Foreseen demand").

One `LearnedProfile` row named ``demand``, on the wall clock's buckets (bucket 0 starts at midnight
UTC): the embedded engine counts on the event loop's clock, so the profile is turned by the
buckets between the two (``wall_offset_ms``) on the way in and out. Stored at rest, without the
bucket being counted. Written when the engine has learned a bucket since the last write (`tick`, on
the configuration poll) and at close; each write copies the profile on the event loop and encodes
and writes it in a thread of its own. Loaded at start when its ``bucket_ms`` and ``alpha`` are the
configuration's, else ignored (and replaced at the next write).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection

from gateway.db import db_call, log_failure
from scheduling.engine import Scheduler
from scheduling.engine.forecast import DemandProfile
from scheduling.learned import learned_profile_get, learned_profile_save

log = logging.getLogger(__name__)
DEMAND = "demand"
_thread = ThreadPoolExecutor(1, thread_name_prefix="fairgate-demand")  # writes in order, off the loop


def _read(name: str) -> dict[str, Any] | None:
    try:
        return learned_profile_get(name=name)
    finally:
        connection.close()  # one call every bucket: no connection kept between


def _write(name: str, record: dict[str, Any]) -> None:
    try:
        learned_profile_save(name=name, record=record)
    finally:
        connection.close()


class DemandStore:
    """The stored profile of one dispatcher's engine. ``wall_offset_ms``: epoch ms less the
    engine's clock (0 for the shared engine, whose clock is the wall clock)."""

    def __init__(self, *, wall_offset_ms: int, name: str = DEMAND) -> None:
        self.wall_offset_ms = wall_offset_ms
        self.name = name
        self._written: tuple[int, int | None] | None = None  # (the profile's id, its bucket) at the last write
        self.writing: asyncio.Task[None] | None = None

    def wall_buckets(self, bucket_ms: int) -> int:
        """Buckets from the engine's clock to the wall clock (the nearest whole number)."""
        return (self.wall_offset_ms + bucket_ms // 2) // bucket_ms

    async def load(self, engine: Scheduler) -> bool:
        """The stored profile into ``engine`` when it predicts and the profile's settings are its own
        (a record that does not read is logged and ignored)."""
        demand = engine.demand
        if demand is None:
            return False
        record = await db_call(_read, thread=_thread)(self.name)
        if record is None:
            return False
        try:
            stored = DemandProfile.from_record(record)
        except (KeyError, TypeError, ValueError):
            log.warning("stored demand profile ignored: it does not read as a profile")
            return False
        if not stored.compatible(bucket_ms=demand.bucket_ms, alpha=demand.alpha):
            log.info("stored demand profile ignored: bucket_ms or alpha differ from the configuration's")
            return False
        engine.demand = stored.turned(-self.wall_buckets(stored.bucket_ms))
        self._written = (id(engine.demand), None)
        return True

    def tick(self, engine: Scheduler) -> None:
        """On the event loop: starts a write if the engine learned a bucket since the last one and
        none is under way."""
        demand = engine.demand
        if demand is None or not demand.profiles or (id(demand), demand.bucket) == self._written:
            return
        if self.writing is None or self.writing.done():
            self.writing = asyncio.get_running_loop().create_task(self._save_logged(engine))

    async def _save_logged(self, engine: Scheduler) -> None:
        try:
            await self.save(engine)
        except Exception:
            log_failure(log, "the demand profile could not be stored")

    async def save(self, engine: Scheduler) -> None:
        """Writes ``engine``'s profile now (after a write under way)."""
        writing = self.writing
        if writing is not None and writing is not asyncio.current_task() and not writing.done():
            await asyncio.gather(writing, return_exceptions=True)
        demand = engine.demand
        if demand is None or not demand.profiles:
            return
        mark = (id(demand), demand.bucket)
        record = demand.turned(self.wall_buckets(demand.bucket_ms)).as_record()
        await db_call(_write, thread=_thread)(self.name, record)
        self._written = mark
