"""Intake lanes: the work before admission, ordered by class.

A request's intake (its body, the tiktoken estimate, the downgrade rules) runs in a lane per
class level, chosen from what costs nothing (the key and ``X-Priority-Class``): the top class
never waits, the others take turns ``FAIRGATE_INTAKE_CONCURRENCY`` at a time, most urgent first,
and past ``FAIRGATE_INTAKE_BACKLOG`` waiting the next is refused ``429 queue_full``. A request
whose class cannot be told waits after every class. Why: docs/architecture.md (the ingress).
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from django.conf import settings

from gateway import metrics
from gateway.errors import ErrorCode, GatewayError

INTAKE_FULL_RETRY_MS = 1_000
UNIDENTIFIED_LEVEL = sys.maxsize  # the lane of requests whose class is not known before intake: after every class
UNIDENTIFIED = "unidentified"  # its name in the metric and the 429


def intake_full(cls: str, backlog: int) -> GatewayError:
    return GatewayError(
        429,
        ErrorCode.QUEUE_FULL,
        f"Too many {cls} requests are waiting to be read ({backlog}): retry after the Retry-After delay.",
        retry_after_ms=INTAKE_FULL_RETRY_MS,
    )


class IntakeLanes:
    """Turns at intake for the classes below the top: ``concurrency`` at once, the lowest level
    waiting first. Invariant: a request waits only while every turn is taken (a freed turn is
    handed straight to the next waiter, so ``busy`` counts it until that waiter has run)."""

    def __init__(self, *, concurrency: int, backlog: int) -> None:
        self.concurrency = concurrency
        self.backlog = backlog
        self.busy = 0
        self._waiting: dict[int, deque[asyncio.Future[None]]] = {}

    def waiting(self, level: int) -> int:
        return len(self._waiting.get(level, ()))

    async def enter(self, *, level: int, cls: str) -> None:
        """Returns holding a turn; ``leave`` gives it back. Raises 429 when ``cls``'s backlog is full."""
        if self.busy < self.concurrency:
            self.busy += 1
            return
        queue = self._waiting.setdefault(level, deque())
        if len(queue) >= self.backlog:
            raise intake_full(cls, self.backlog)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(turn)
        metrics.INTAKE_WAITING.labels(cls).inc()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.cancelled():  # never handed a turn: it leaves its queue (if `leave` has not dropped it)
                if turn in queue:
                    queue.remove(turn)
            else:  # handed a turn as it was cancelled: the turn goes on to the next waiter
                self.leave()
            raise
        finally:
            metrics.INTAKE_WAITING.labels(cls).dec()

    def leave(self) -> None:
        for level in sorted(self._waiting):
            queue = self._waiting[level]
            while queue:
                turn = queue.popleft()
                if not turn.done():  # the turn passes on: busy is unchanged
                    turn.set_result(None)
                    return
        self.busy -= 1

    async def take(self, *, level: int, cls: str) -> Turn:
        """A turn held until the returned `Turn` is released (``enter`` for a turn taken in one
        place and given back in another). Raises 429 when ``cls``'s backlog is full."""
        await self.enter(level=level, cls=cls)
        return Turn(self, level=level, cls=cls)

    @asynccontextmanager
    async def lane(self, *, level: int, top_level: int, cls: str) -> AsyncIterator[bool]:
        """A turn for a request of ``cls`` (none needed in the top class); yields whether the request
        runs in a lane (below the top class: its costly steps should then leave the event loop)."""
        if level <= top_level:
            yield False
            return
        await self.enter(level=level, cls=cls)
        try:
            yield True
        finally:
            self.leave()


class Turn:
    """One request's turn at intake, taken before its body is read (gateway.asgi) and released
    once its intake is done (gateway.intake) or, whatever happens, when its request ends: the
    first ``release`` gives the turn back, later ones do nothing. A turn given back early (its
    body was slow to come) is waited for ``again`` before the costly steps."""

    __slots__ = ("_lanes", "cls", "held", "level")

    def __init__(self, lanes: IntakeLanes, *, level: int, cls: str) -> None:
        self._lanes = lanes
        self.level = level
        self.cls = cls
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._lanes.leave()

    async def again(self) -> None:
        """Holding the turn once more (at the back of its class's waiters), if it was released.
        Raises 429 when the class's backlog is full."""
        if not self.held:
            await self._lanes.enter(level=self.level, cls=self.cls)
            self.held = True


_lanes: IntakeLanes | None = None


def lanes() -> IntakeLanes:
    """This process's lanes, made on first use from the settings."""
    global _lanes
    if _lanes is None:
        _lanes = IntakeLanes(concurrency=settings.FAIRGATE_INTAKE_CONCURRENCY, backlog=settings.FAIRGATE_INTAKE_BACKLOG)
    return _lanes


def lanes_reset() -> None:
    """Forget this process's lanes (tests that change the settings)."""
    global _lanes
    _lanes = None
