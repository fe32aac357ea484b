"""Refused keys past a free rate have their 401 held back a while: a flood of made-up
keys from clients that wait for each answer is slowed to what a timer costs, and a valid key is
never held (docs/money.md, "Refused before it costs anything")."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from django.conf import settings


class Tarpit:
    """A token bucket of free refusals (``free_per_s``, at most ``burst`` at once); a refusal
    without a token waits about ``delay_s`` (0.5-1.5x), unless ``max_waiting`` wait already."""

    def __init__(
        self,
        *,
        free_per_s: float,
        burst: int,
        delay_s: float,
        max_waiting: int,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.free_per_s = free_per_s
        self.burst = burst
        self.delay_s = delay_s
        self.max_waiting = max_waiting
        self.waiting = 0
        self._clock = clock
        self._jitter = jitter
        self._tokens = float(burst)
        self._filled_s = clock()

    def delay_of_next(self) -> float:
        """Counts one refusal; how long its answer waits (0 with a free token, or when full)."""
        now_s = self._clock()
        self._tokens = min(self.burst, self._tokens + (now_s - self._filled_s) * self.free_per_s)
        self._filled_s = now_s
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        if self.waiting >= self.max_waiting:
            return 0.0
        return self.delay_s * (0.5 + self._jitter())  # spread: those held at once are not answered at once

    async def hold(self) -> None:
        """Waits as long as this refusal's answer is held back."""
        delay_s = self.delay_of_next()
        if delay_s <= 0:
            return
        self.waiting += 1
        try:
            await asyncio.sleep(delay_s)
        finally:
            self.waiting -= 1


_tarpit: Tarpit | None = None


def tarpit() -> Tarpit:
    global _tarpit
    if _tarpit is None:
        _tarpit = Tarpit(
            free_per_s=settings.FAIRGATE_AUTH_TARPIT_FREE_PER_S,
            burst=settings.FAIRGATE_AUTH_TARPIT_BURST,
            delay_s=settings.FAIRGATE_AUTH_TARPIT_MS / 1000,
            max_waiting=settings.FAIRGATE_AUTH_TARPIT_MAX,
        )
    return _tarpit
