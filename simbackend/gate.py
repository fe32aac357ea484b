"""A gate in front of the simulated GPU's answers, so tests can wait for states instead of times.

A request that has been admitted to a slot passes the gate before it starts answering. The gate
is open by default (nothing is held). Closed, it holds each admitted request, its slot still
busy (what a stuck GPU looks like), until the controller lets it through:

- ``close()``: hold every request from now on (credits from before are dropped);
- ``allow(n=1)``: let ``n`` more through, the longest held first, or, if fewer are held, the
  next ones as they arrive;
- ``open()``: let everything through, the held ones and all later ones;
- ``waiting``: how many are held right now.

The methods may be called from any thread (the simulator's event loop runs in a thread of its
own in tests): state is guarded by a lock, and a held request is woken on its own loop with
``call_soon_threadsafe``. A request's service time starts when it is let through.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque


class Gate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = True
        self._credits = 0
        self._held: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    # --- the controller (any thread) -----------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._open = False
            self._credits = 0

    def open(self) -> None:
        with self._lock:
            self._open = True
            self._credits = 0
            released = list(self._held)
            self._held.clear()
        for loop, future in released:
            _wake(loop, future)

    def allow(self, n: int = 1) -> None:
        """Let ``n`` more requests through (no effect while open)."""
        if n < 0:
            raise ValueError("allow(n) needs n >= 0")
        with self._lock:
            if self._open:
                return
            released = self._grant(n)
        for loop, future in released:
            _wake(loop, future)

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open

    @property
    def waiting(self) -> int:
        """Requests held at the gate right now (not counting those already let through)."""
        with self._lock:
            return len(self._held)

    @property
    def credits(self) -> int:
        """Requests that will still pass without being held (given by ``allow``, not used yet)."""
        with self._lock:
            return self._credits

    def state(self) -> dict[str, object]:
        with self._lock:
            return {"open": self._open, "waiting": len(self._held), "credits": self._credits}

    # --- the requests (on the simulator's loop) ------------------------------------------

    def try_pass(self) -> bool:
        """True if a request may go on at once (the gate is open, or a credit is left)."""
        with self._lock:
            if self._open:
                return True
            if self._credits:
                self._credits -= 1
                return True
            return False

    async def passage(self) -> None:
        """Wait until let through (first trying to pass at once)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._open:
                return
            if self._credits:
                self._credits -= 1
                return
            future: asyncio.Future[None] = loop.create_future()
            entry = (loop, future)
            self._held.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                try:
                    self._held.remove(entry)
                    released = []
                except ValueError:  # let through just as it was cancelled: pass the turn on
                    released = [] if self._open else self._grant(1)
            for other_loop, other in released:
                _wake(other_loop, other)
            raise

    def _grant(self, n: int) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]:
        """Under the lock: release up to ``n`` held requests, keep the rest of ``n`` as credits."""
        released = []
        while n and self._held:
            released.append(self._held.popleft())
            n -= 1
        self._credits += n
        return released


def _wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    try:
        loop.call_soon_threadsafe(_resolve, future)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
