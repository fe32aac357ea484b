"""The billing worker: a process of the gateway's own that books billing batches
(gateway.charging), so booking never competes with the event loop for the GIL.

`Worker` is the gateway's side: it spawns the process and exchanges one pickled message each way
per batch over a pipe, read by the event loop itself (no helper threads, which would compete for
the GIL again). The functions below it run in the worker; the spawned process imports this module
before Django is set up, so nothing here imports Django or an app at module level.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import threading
import time
from collections import deque
from typing import Callable, Union

READY = b"ready"
IDLE_S = 0.002  # no ask for this long: time to reload an ageing cache entry (about a millisecond each)
CACHE_CHECK_S = 0.1  # while idle with nothing to reload, how often to look again
Answer = Callable[[Union[bytes, BaseException]], None]
START_TIMEOUT_S = 60.0


class WorkerDied(RuntimeError):
    """The billing worker ended before answering. Whether the batch committed is unknown, and need
    not be: booking is idempotent per request id, so the batch is booked again by a new worker."""


def _settle(future: asyncio.Future, answer: bytes | BaseException) -> None:
    if future.done():
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)


class Worker:
    """Batches go to the worker in order and their answers come back in that order."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, os.getpid()), name="fairgate-billing",
                                       daemon=True)
        self.process.start()
        child.close()
        self._waiting: deque[Answer] = deque()  # one per message still to come back
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead = False

    async def started(self) -> None:
        """Wait until Django is set up in the worker (about a second)."""
        future = asyncio.get_running_loop().create_future()
        self._expect(lambda answer: _settle(future, answer))
        if await asyncio.wait_for(future, START_TIMEOUT_S) != READY:
            raise WorkerDied("the billing worker did not start")

    async def call(self, asks: list) -> tuple[list[object], list[dict]]:
        """One batch: billing.booking.book's results and the console events it produced."""
        future = asyncio.get_running_loop().create_future()
        self.send(asks, lambda answer: _settle(future, answer))
        return pickle.loads(await future)

    def send(self, asks: list, on_answer: Answer) -> None:
        """`call` without the wait: `on_answer` gets the pickled answer, or WorkerDied, straight
        from the event loop's reader (no future or task in between)."""
        if self.dead:
            on_answer(WorkerDied("the billing worker has ended"))
            return
        self._expect(on_answer)
        try:
            self.conn.send_bytes(pickle.dumps(asks, pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            self._died(exc)

    def _expect(self, on_answer: Answer) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.conn.fileno(), self._readable)
        self._waiting.append(on_answer)

    def _readable(self) -> None:
        try:
            message = self.conn.recv_bytes()
        except (EOFError, OSError) as exc:
            self._died(exc)
            return
        self._waiting.popleft()(message)

    def _died(self, exc: BaseException) -> None:
        """The pipe broke: every answer still to come fails."""
        self.dead = True
        self._unread()
        died = WorkerDied(f"the billing worker ended: {exc!r}")
        while self._waiting:
            self._waiting.popleft()(died)

    def _unread(self) -> None:
        if self._loop is not None and not self.conn.closed:
            self._loop.remove_reader(self.conn.fileno())
        self._loop = None

    async def stop(self) -> None:
        self._unread()
        self.conn.close()  # the worker sees EOF and exits
        await asyncio.get_running_loop().run_in_executor(None, self._join)

    def _join(self) -> None:
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


# --- in the worker process -------------------------------------------------------------------------

_events: list[dict] = []  # console events of the batch being booked, handed back to the gateway


def serve(conn, gateway_pid: int) -> None:
    import django

    django.setup()
    from billing.cache import caches_refresh_one
    from console.live.hooks import collect_events

    collect_events(_events)
    threading.Thread(target=_exit_with, args=(gateway_pid,), daemon=True, name="orphan-check").start()
    conn.send_bytes(READY)
    while True:
        if not conn.poll(IDLE_S):  # idle: reload what is ageing now, not when a request needs it
            if not caches_refresh_one():
                conn.poll(CACHE_CHECK_S)
            continue
        try:
            asks = pickle.loads(conn.recv_bytes())
        except EOFError:  # the gateway stopped
            return
        conn.send_bytes(pickle.dumps(book_batch(asks), pickle.HIGHEST_PROTOCOL))


def _exit_with(gateway_pid: int) -> None:
    """A worker whose gateway died (killed, not stopped) ends too."""
    while os.getppid() == gateway_pid:
        time.sleep(1.0)
    os._exit(0)


def book_batch(asks: list) -> tuple[list[object], list[dict]]:
    """billing.booking.book, plus the console events it produced. Refusals cross back as they
    are (billing's errors pickle); any other error as a BillingError naming it."""
    from django.db import close_old_connections

    from billing.booking import book
    from billing.errors import BillingError

    close_old_connections()  # recycle a stale or expired connection
    try:
        results = book(asks)
    except Exception as failed:  # the whole batch
        results = [failed] * len(asks)
    results = [r if not isinstance(r, BaseException) or isinstance(r, BillingError)
               else BillingError(f"{type(r).__name__}: {r}") for r in results]
    events = list(_events)
    _events.clear()
    return results, events
