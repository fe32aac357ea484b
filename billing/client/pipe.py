"""The gateway process's end of its billing worker's pipe: `Worker` spawns the worker
(billing.worker, its loop billing.worker_loop) and exchanges one pickled message each way per
batch over one duplex socket, read and written by the event loop itself, non-blocking, with
billing.worker_protocol's framing. Only a broken pipe ends a worker (end of file,
ECONNRESET/EPIPE, a corrupt frame header); would-block never does. Why it is built this way:
docs/billing-and-console.md ("The billing client").
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
from collections import deque
from collections.abc import Callable

from billing.client import metrics
from billing.worker import serve
from billing.worker_protocol import READY, STOP, Frames, frame_header

log = logging.getLogger("gateway.billing_worker")  # the name its log lines have always had

Answer = Callable[[bytes | BaseException], None]
START_TIMEOUT_S = 60.0
READ_CHUNK = 64 * 1024  # bytes per read: os.read allocates this much for every read, small answers too


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


def _deliver(on_answer: Answer, answer: bytes | BaseException) -> None:
    """One answer to its callback. A callback that fails is reported as the event loop reports
    any callback's failure, and the answers after it still go to their own callbacks."""
    try:
        on_answer(answer)
    except Exception as exc:
        asyncio.get_running_loop().call_exception_handler(
            {"message": "a billing worker answer's callback failed", "exception": exc}
        )


class Worker:
    """Batches go to the worker in order and their answers come back in that order."""

    def __init__(self, owner: str = "") -> None:
        """``owner``: the gateway process the worker beats for (billing.heartbeats); empty: none."""
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=serve, args=(child, os.getpid(), owner), name="fairgate-billing", daemon=True
        )
        self.process.start()
        child.close()
        os.set_blocking(self.conn.fileno(), False)  # the worker's end stays blocking (a socket of its own)
        self._waiting: deque[Answer] = deque()  # one per message still to come back
        self._frames = Frames()  # what has arrived of the answers
        self._outgoing = bytearray()  # framed batches the socket has not taken yet
        self._writing = False  # waiting for the socket to be writable
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead = False

    async def started(self) -> None:
        """Wait until Django is set up in the worker (about a second)."""
        future = asyncio.get_running_loop().create_future()
        self._expect(lambda answer: _settle(future, answer))
        if await asyncio.wait_for(future, START_TIMEOUT_S) != READY:
            raise WorkerDied("the billing worker did not start")

    async def call(self, asks: list) -> tuple[list[object], dict[tuple[int, str], bytes], dict | None]:
        """One batch: billing.booking.book's results and the console events it produced."""
        future = asyncio.get_running_loop().create_future()
        self.send(asks, lambda answer: _settle(future, answer))
        return pickle.loads(await future)

    def send(self, asks: list, on_answer: Answer) -> None:
        """`call` without the wait: `on_answer` gets the pickled answer, or WorkerDied, straight
        from the event loop's reader (no future or task in between). What the socket does not
        take at once is written when it is writable again; the batch is never half sent."""
        if self.dead:
            on_answer(WorkerDied("the billing worker has ended"))
            return
        self._expect(on_answer)
        payload = pickle.dumps(asks, pickle.HIGHEST_PROTOCOL)
        self._outgoing += frame_header(len(payload))
        self._outgoing += payload
        self._flush()

    def _expect(self, on_answer: Answer) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.conn.fileno(), self._readable)
        self._waiting.append(on_answer)

    # --- the event loop's callbacks ---

    def _readable(self) -> None:
        """Reads what has arrived and answers each whole message; the end of the pipe ends the worker."""
        if self.dead:
            return
        try:
            ended = self._read_available()
            messages = self._frames.whole()
        except (OSError, ValueError) as exc:  # ECONNRESET and the like; a corrupt stream
            self._died(exc)
            return
        for message in messages:
            if self.dead:  # an answer's callback ended it (a send that failed)
                return
            _deliver(self._waiting.popleft(), message)
        if ended:
            self._died(EOFError("the pipe was closed" + (" mid-answer" if self._frames.partial else "")))

    def _read_available(self) -> bool:
        """Reads until the socket would block; True at end of file."""
        fd = self.conn.fileno()
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return False
            if not data:
                return True
            self._frames.feed(data)

    def _flush(self) -> None:
        """Writes what the socket takes now, and waits for it to be writable if more is left."""
        if self.dead:
            return
        try:
            self._write_available()
        except OSError as exc:  # EPIPE, ECONNRESET: the worker is gone
            self._died(exc)
            return
        self._watch_writable(bool(self._outgoing))

    def _write_available(self) -> None:
        fd = self.conn.fileno()
        while self._outgoing:
            try:
                with memoryview(self._outgoing) as view:
                    written = os.write(fd, view)
            except BlockingIOError:
                return
            del self._outgoing[:written]

    def _watch_writable(self, watch: bool) -> None:
        if watch == self._writing:
            return
        loop = self._loop
        assert loop is not None  # set by `_expect` before the first batch is written
        if watch:
            loop.add_writer(self.conn.fileno(), self._flush)
        else:
            loop.remove_writer(self.conn.fileno())
        self._writing = watch

    # --- the end ---

    def _died(self, exc: BaseException) -> None:
        """The pipe broke: every answer still to come fails (WARNING, counted)."""
        if self.dead:
            return
        self.dead = True
        self._unwatch()
        self._outgoing.clear()
        why = f"{exc!r}{self._exit_note()}"
        log.warning("the billing worker (pid %s) ended: %s", self.process.pid, why)
        metrics.BILLING_WORKER_REPLACEMENTS.inc()
        died = WorkerDied(f"the billing worker ended: {why}")
        while self._waiting:
            _deliver(self._waiting.popleft(), died)

    def _exit_note(self) -> str:
        code = self.process.exitcode  # None while it runs (or is not reaped yet)
        return "" if code is None else f", exit code {code}"

    def _unwatch(self) -> None:
        if self._loop is not None and not self.conn.closed:
            self._loop.remove_reader(self.conn.fileno())
            self._loop.remove_writer(self.conn.fileno())
        self._loop = None
        self._writing = False

    async def stop(self) -> None:
        """A clean stop: `STOP`, then the pipe closed (an end of file alone means the gateway died)."""
        self._unwatch()
        if not self.dead:
            try:
                os.set_blocking(self.conn.fileno(), True)
                self._write_available()  # the rest of a batch the socket had not taken
                self.conn.send_bytes(STOP)
            except OSError:  # the worker is gone already
                pass
        self.conn.close()
        await asyncio.get_running_loop().run_in_executor(None, self._join)

    def _join(self) -> None:
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


__all__ = ["READY", "Worker", "WorkerDied", "serve"]  # serve: the process it spawns (billing.worker)
