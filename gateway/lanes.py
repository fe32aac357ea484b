"""Intake lanes: the work before admission, ordered by class.

A request's intake (parsing its body, estimating its prompt's tokens with tiktoken, the
downgrade rules) costs the gateway CPU before the engine ever sees it. Run first come, first
served, a flood of batch requests (a finance job sending 2,000 at once) makes every interactive
request behind it wait for all their intakes: the ingress itself would undo the priority that
the engine sells. So the costly steps run in lanes, one per class level, read from what costs
nothing (the key and the ``X-Priority-Class`` header, before the body is parsed):

* the top class never waits here (its requests are short by the downgrade rules, and a person
  waits for each);
* the other classes run their intake at most ``concurrency`` at a time
  (``FAIRGATE_INTAKE_CONCURRENCY``): a freed turn goes to the most urgent class waiting (the
  lowest level), in arrival order within it; their long prompts are estimated off the event loop
  (tiktoken releases the GIL), so the loop stays free for the top class meanwhile;
* at most ``backlog`` requests of a class wait for a turn (``FAIRGATE_INTAKE_BACKLOG``): the next
  one is refused at once, ``429 queue_full`` with ``Retry-After``, instead of the backlog growing.

A turn covers intake only: the hold and the wait in the engine's queue come after it, so a slow
booking never holds a lane. The lanes are one process's (each gateway process reads its own
requests); the engine's queues are where the classes meet across processes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from django.conf import settings

from gateway import metrics
from gateway.errors import ErrorCode, GatewayError

INTAKE_FULL_RETRY_MS = 1_000


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
