"""The group commit of the request path's billing asks: one `Booker` per gateway process sends
holds, settlements and releases in batches to its billing worker (billing.client.pipe, which
books each batch with billing.booking.book in one transaction). An ask someone waits for goes
at once; the others may wait up to ``FAIRGATE_BILLING_LINGER_MS`` for company. A settlement is
journaled first (billing.journal) and ``X-Charge`` is priced here as the booking prices it. The
guarantees, and why it is built this way: docs/money.md.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from datetime import UTC, datetime
from typing import Literal, overload

from django.conf import settings

import events
from billing.booking_asks import Ask, Charged, HoldAsk, ReleaseAsk, SettleAsk
from billing.client import metrics, pipe
from billing.client.port import CANCELLED, Hold
from billing.client.unbooked import Unbooked
from billing.heartbeats import process_owner
from billing.inflight import HeldEntry, held_forget, held_remember
from billing.pricing import UnitPrices, capped, charge_of
from billing.worker_protocol import BatchAnswer

log = logging.getLogger("gateway.charging")  # the name its log lines have always had (operators' filters)
STOP_DRAIN_S = 10.0  # at a clean stop, how long to wait for the bookings still on their way


def now_utc() -> datetime:
    """timezone.now() as the settings make it (USE_TZ: aware, UTC), without reading the settings
    on every hold and end (a tenth of a percent of a busy gateway's CPU each)."""
    return datetime.now(UTC)


def _charge_to_tell(ask: SettleAsk, held: Hold) -> Charged | None:
    """The charge ``X-Charge`` tells, priced as the booking will price ``ask`` (see the module's
    doc); None without a base cost or without the hold's booked factor and amount."""
    if ask.base_cost is None or held.factor is None or held.amount is None:
        return None
    return Charged(*capped(charge_of(base_cost=ask.base_cost, factor=held.factor), held.amount))


class Booker:
    """Collects asks on the event loop and books them in batches in the billing worker: a process
    of its own (spawned, one Django connection), so booking never competes with the event loop
    for the GIL. Holds and ends are mirrored in this process's memo of holds (billing.inflight,
    which the console's queue table reads); the live events the worker committed are sent here (events.send)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Ask, asyncio.Future | None]] = []  # None: no one waits for it
        self._in_flight = False
        self._urgent = False  # an ask someone waits for is pending
        self._linger: asyncio.TimerHandle | None = None  # sends the pending asks that may linger
        self._pending_since = 0.0  # when the oldest pending ask was submitted (the loop's clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: pipe.Worker | None = None
        self._worker_ready: asyncio.Future | None = None
        self.unbooked = Unbooked(lambda ask: self.submit(ask, answer=False, urgent=False))
        self.prices: dict[str, UnitPrices] = {}  # each backend's, as the billing worker last read them
        # Request ids whose hold's release is still to be sent (an early hold released before it
        # was booked; a hold whose caller left while it was booked): a new hold of the same id
        # waits for it, so the booking sees the release first (see `release_pending`).
        self._releasing: dict[str, asyncio.Future[None]] = {}

    async def start(self) -> None:
        """Start the worker now (Django's start-up in it takes a second), not on the first batch,
        and book what dead processes on this host left in their journals."""
        await self._started()
        self.unbooked.adopt_orphans()

    async def _started(self) -> pipe.Worker:
        if self._worker is not None and self._worker.dead:
            await self._forget(self._worker)
        if self._worker is None:
            self._worker = pipe.Worker(owner=process_owner())
            self._worker_ready = asyncio.ensure_future(self._worker.started())
        worker, ready = self._worker, self._worker_ready
        assert ready is not None  # set with its worker
        try:
            await ready  # no wait once it has started
        except BaseException:
            await self._forget(worker)
            raise
        return worker

    async def _forget(self, worker: pipe.Worker) -> None:
        if self._worker is worker:
            self._worker = None
            await worker.stop()

    async def stop(self) -> None:
        """Books what is waiting (the journal keeps what cannot be), then stops the worker."""
        deadline_s = time.monotonic() + STOP_DRAIN_S
        if self._loop is asyncio.get_running_loop():
            self.hurry()
        while (self._pending or self._in_flight) and time.monotonic() < deadline_s:
            await asyncio.sleep(0.01)
        if self._worker is not None:
            await self._forget(self._worker)
        self.unbooked.close()

    def settle(self, ask: SettleAsk, held: Hold) -> asyncio.Future:
        """Journals ``ask`` and books it: the future gives the Charged once the line is written (or synced)
        (``ask`` priced with its ``base_cost``, see the module's doc), or, when that cannot be,
        the booking's result once it is booked (None if it could not be: then it is kept and
        retried)."""
        charged = _charge_to_tell(ask, held)
        try:
            durable: asyncio.Future | None = self.unbooked.journal.keep(ask)
        except OSError as failed:
            log.error("could not journal the settlement of %s: %r", ask.request_id, failed)
            durable = None
        if charged is None or durable is None:  # the answer waits for the booking
            return self.submit(ask)
        self.submit(ask, answer=False, urgent=False)  # no one waits for the booking
        result = asyncio.get_running_loop().create_future()
        if durable.done() and durable.exception() is None:  # written already: told without a turn
            result.set_result(charged)
            return result

        def on_disk(done: asyncio.Future) -> None:
            if result.done():  # the client left
                return
            if done.exception() is None:
                result.set_result(charged)
            else:  # the journal failed: the answer waits for the booking (an ask booked twice books once)
                self.submit(ask).add_done_callback(booked)

        def booked(done: asyncio.Future) -> None:
            if not result.done():
                result.set_result(done.result())

        durable.add_done_callback(on_disk)
        return result

    @overload
    def submit(self, ask: Ask, *, answer: Literal[True] = ..., urgent: bool = ...) -> asyncio.Future: ...

    @overload
    def submit(self, ask: Ask, *, answer: Literal[False], urgent: bool = ...) -> None: ...

    def submit(self, ask: Ask, *, answer: bool = True, urgent: bool = True) -> asyncio.Future | None:
        """Queues ``ask``; its future gives the result once booked. With ``answer=False`` no one
        waits: a failure is logged. Not ``urgent`` (no one waits for it now: a settlement that is
        journaled, a release, an early hold): it may wait up to ``FAIRGATE_BILLING_LINGER_MS`` for
        others to share its batch (`hurry` sends what waits at once)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): what the old one left cannot be answered
            self._loop, self._pending, self._in_flight, self._linger = loop, [], False, None
            self._releasing = {}
        future = loop.create_future() if answer else None
        if not self._pending:
            self._pending_since = loop.time()
        self._pending.append((ask, future))
        self._urgent |= urgent
        self._send()
        return future

    def release_pending(self, request_id: str) -> None:
        """``request_id``'s hold will be released once it is booked: until `release_sent`, a new
        hold of that id waits (`releases_sent`). Booked in the order asks are submitted, the
        release then comes first; else the booking would give the new request the old one's open
        hold (a retried admission, to the booking) and then release it under it."""
        if request_id not in self._releasing:
            self._releasing[request_id] = asyncio.get_running_loop().create_future()

    def release_sent(self, request_id: str) -> None:
        waiting = self._releasing.pop(request_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def releases_sent(self, request_id: str) -> None:
        """Returns once no release of ``request_id``'s hold is still to be sent."""
        while (waiting := self._releasing.get(request_id)) is not None:
            await asyncio.shield(waiting)

    def releasing(self, request_id: str) -> bool:
        return request_id in self._releasing

    def hurry(self) -> None:
        """Someone waits for an ask: what waits goes now (or as soon as the batch out is answered)."""
        self._urgent = True
        self._send()

    @property
    def _asks_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of the asks pending and out: set by `submit`, which each came through."""
        assert self._loop is not None
        return self._loop

    def _ready_worker(self) -> pipe.Worker | None:
        ready = self._worker_ready
        if (
            self._worker is None
            or self._worker.dead
            or ready is None
            or not ready.done()
            or ready.cancelled()
            or ready.exception() is not None
        ):
            return None
        return self._worker

    def _send(self) -> None:
        """Everything waiting goes as one batch, unless a batch is out already, or nothing waiting
        is urgent and its linger has not run out. Sent from here and answered in a callback: no task
        in between, so a batch costs the event loop no extra turns. (Two or four batches out at
        once were measured no faster at saturation; four slower.)"""
        if not self._pending or self._in_flight:
            return
        if not self._urgent:  # only asks that may linger: until the oldest has waited the linger
            wait_s = self._pending_since + settings.FAIRGATE_BILLING_LINGER_MS / 1000 - self._asks_loop.time()
            if wait_s > 0:
                if self._linger is None:
                    self._linger = self._asks_loop.call_later(wait_s, self.hurry)
                return
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        batch, self._pending, self._urgent = self._pending, [], False
        self._in_flight = True
        started_s = self._asks_loop.time()
        worker = self._ready_worker()
        if worker is None:  # not started yet, or ended: start one first
            self._asks_loop.create_task(self._run(batch, started_s))
            return
        worker.send([ask for ask, _ in batch], lambda answer: self._answered(batch, started_s, answer))

    def _answered(
        self, batch: list[tuple[Ask, asyncio.Future | None]], started_s: float, answer: bytes | BaseException
    ) -> None:
        if isinstance(answer, pipe.WorkerDied):
            self._asks_loop.create_task(self._run(batch, started_s))
        else:
            self._finish(batch, started_s, answer if isinstance(answer, BaseException) else pickle.loads(answer))

    async def _run(self, batch: list[tuple[Ask, asyncio.Future | None]], started_s: float) -> None:
        """The slow way, with a worker to start or replace (booking is idempotent: a batch whose
        worker ended is booked again by a new one)."""
        asks = [ask for ask, _ in batch]
        outcome: BaseException | BatchAnswer
        for _attempt in range(2):
            worker = await self._started()
            try:
                outcome = await worker.call(asks)
                break
            except pipe.WorkerDied as died:
                log.warning("%s; booking the batch again in a new one", died)  # died says why it ended
                await self._forget(worker)
                outcome = died
            except BaseException as failed:
                outcome = failed
                break
        self._finish(batch, started_s, outcome)

    def _finish(
        self,
        batch: list[tuple[Ask, asyncio.Future | None]],
        started_s: float,
        outcome: BaseException | BatchAnswer,
    ) -> None:
        self._in_flight = False
        results: list[object]
        try:
            if isinstance(outcome, BaseException):  # the whole batch: every caller gets the error
                log.error("billing batch of %s failed: %r", len(batch), outcome)
                results = [outcome] * len(batch)
            else:
                results, committed, prices = outcome
                if prices is not None:
                    self.prices = prices
                metrics.BILLING_BATCH_SECONDS.observe(self._asks_loop.time() - started_s)
                metrics.BILLING_BATCH_ASKS.observe(len(batch))
                if committed:  # committed in the worker: sent here, where they are watched
                    events.send(committed)
            for (ask, future), result in zip(batch, results):
                if isinstance(ask, HoldAsk):
                    if isinstance(result, HeldEntry):
                        held_remember(result)
                else:  # an end: booked, or kept until it is (billing.client.unbooked)
                    held_forget(ask.request_id)
                    if isinstance(result, BaseException):
                        self.unbooked.failed(ask, result)  # kept and retried (a settlement is journaled)
                        result = None if isinstance(ask, SettleAsk) else False
                    else:
                        self.unbooked.booked(ask)
                if isinstance(result, Charged) and result.unbilled:
                    metrics.BILLING_UNBILLED.inc(float(result.unbilled))
                if future is None:
                    if isinstance(result, BaseException):
                        log.error("could not book %s for %s: %r", type(ask).__name__, ask.request_id, result)
                elif future.cancelled():  # the caller left: a hold booked for it is given back
                    if isinstance(ask, HoldAsk) and isinstance(result, HeldEntry):
                        self.submit(
                            ReleaseAsk(
                                request_id=result.request_id,
                                reason=CANCELLED,
                                at=now_utc(),
                                held=result,
                            ),
                            answer=False,
                            urgent=False,
                        )
                    self.release_sent(ask.request_id)
                elif isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        finally:
            self._send()


_booker: Booker | None = None


def booker() -> Booker:
    global _booker
    if _booker is None:
        _booker = Booker()
    return _booker


async def start() -> None:
    if settings.FAIRGATE_BILLING:
        await booker().start()


async def stop() -> None:
    if _booker is not None:
        await _booker.stop()
