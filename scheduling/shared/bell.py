"""Sleeping in an event loop until woken (`Bell`) or stopped (`sleep_or`), without a task per sleep."""

from __future__ import annotations

import asyncio


class Bell:
    """What a loop sleeps on (`sleep`) and others wake it with (`ring`): no task per sleep."""

    def __init__(self) -> None:
        self._rung = False
        self._sleeping: asyncio.Future[None] | None = None

    def ring(self) -> None:
        self._rung = True
        if self._sleeping is not None and not self._sleeping.done():
            self._sleeping.set_result(None)

    async def sleep(self, timeout_s: float | None) -> None:
        """Returns when rung (at once if rung since the last sleep) or after ``timeout_s``."""
        if not self._rung:
            loop = asyncio.get_running_loop()
            self._sleeping = sleeping = loop.create_future()
            timer = None if timeout_s is None else loop.call_later(timeout_s, _settle, sleeping)
            try:
                await sleeping
            finally:
                self._sleeping = None
                if timer is not None:
                    timer.cancel()
        self._rung = False


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def sleep_or(stop: asyncio.Event, seconds: float) -> None:
    """Sleeps ``seconds``, or less if ``stop`` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
