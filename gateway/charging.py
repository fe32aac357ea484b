"""The billing seam of the request path: hold, settle, release, booked by group commit.

* ``hold`` before admission, with the estimate; raises ``GatewayError(402 budget_exhausted)``
  unless the tenant is configured to fall back to a cheaper class that fits (then the returned
  hold names that class, and the gateway shows ``rule=budget``); or ``hold_early``, for a tenant
  with ample room: booked while the request goes on, confirmed before its answer's first byte
  (see "early holds" below);
* ``settle`` once, when the upstream finished, with the actual usage (for a stream the client
  abandoned: the tokens sent so far, ``partial=True``); returns a future of the charge, set once
  the settlement is in the journal (billing.journal: written, or synced), and booked in the database behind
  it (see "settlements" below);
* ``release`` once, when the request ends without a charge (refused, queue timeout, cancelled
  while waiting, upstream failure).

Exactly one of ``settle``/``release`` follows every ``hold`` that returned. Both hand their ask
to the Booker at once, without a task, and it is booked whether or not anyone waits for it, so a
client disconnect never leaks a hold (nor does a client that leaves while its hold is being
booked: the hold is released once booked). Not awaiting through tasks or shields matters: each
of those costs a turn of a busy event loop, and every turn is added to the request's latency.

Group commit: every ask goes to one ``Booker`` per gateway process. While a batch is being
written by the billing worker, a process of its own (``billing.booking.book``: one
transaction), new asks wait in a list; when it ends they all go in the next one. An ask someone
waits for (a hold before admission) goes at once; the others (journaled settlements, releases,
early holds) may wait up to ``FAIRGATE_BILLING_LINGER_MS`` for company, so a quiet gateway
books a few per transaction instead of one, and a busy one many (the linger then rarely runs
out before the batch out is answered). Fewer transactions is what keeps billing cheap: each
costs the worker and the database about a millisecond of CPU whatever its size.
A hold's caller waits for its hold to commit (an early hold's, before the answer's first byte):
a request never goes on, nor a 402 out, on a booking that could still be lost.

Settlements: the answer's end waits for its settlement to be in a local file, not in the database:
its journal line written, which no process's death can lose (or with ``FAIRGATE_JOURNAL_WAIT=sync``
also ``fdatasync``'d, see billing.journal); the booking follows in the next batch, and if this
process is killed first, its billing worker or the next gateway on this host books it from the
journal. ``X-Charge`` is priced here as the booking prices it: the backend's prices as the billing
worker last read them (sent back with its answers, `Booker.prices`), the hold's factor, at most the
hold; the settlement carries that base cost, so the ledger charges what the client was told. (One
exception, written down in billing.booking: a process taken for dead whose hold went back to the
budget has its late settlement charged at most what the budget still has.) Before the worker's first
answer, or if the journal cannot be written, the answer waits for the booking, as it did before the
journal.

``FAIRGATE_BILLING=0`` turns the seam into no-ops (used by the benchmark that measures billing's
cost).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal, overload

from django.conf import settings

import events
from billing.booking import Ask, Charged, HoldAsk, ReleaseAsk, SettleAsk
from billing.errors import BudgetExhausted, RequestIdInUse, RequestIdUsed
from billing.heartbeats import process_owner
from billing.inflight import HeldEntry, held_forget, held_remember
from billing.money import ZERO
from billing.pricing import UnitPrices, capped, charge_of
from billing.tasks import holds_release_at_startup
from billing.worker import BatchAnswer
from gateway import billing_worker, metrics
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.lifecycle import Outcome, public_id_of
from gateway.unbooked import Unbooked

log = logging.getLogger(__name__)
BUDGET_RULE = "budget"
STOP_DRAIN_S = 10.0  # at a clean stop, how long to wait for the bookings still on their way


def _now() -> datetime:
    """timezone.now() as the settings make it (USE_TZ: aware, UTC), without reading the settings
    on every hold and end (a tenth of a percent of a busy gateway's CPU each)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Hold:
    """What was held for one request. ``cls`` may be lower than asked (budget fallback)."""

    tenant: str
    request_id: str  # the ledger's key: the engine id (tenant/public id), or its attempt (billing.booking)
    cls: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    amount: Decimal | None = None
    fallback: bool = False
    factor: Decimal | None = None  # its class's price factor (once booked)


def _told(ask: SettleAsk, held: Hold) -> Charged | None:
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
        self._worker: billing_worker.Worker | None = None
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

    async def _started(self) -> billing_worker.Worker:
        if self._worker is not None and self._worker.dead:
            await self._forget(self._worker)
        if self._worker is None:
            self._worker = billing_worker.Worker(owner=process_owner())
            self._worker_ready = asyncio.ensure_future(self._worker.started())
        worker, ready = self._worker, self._worker_ready
        assert ready is not None  # set with its worker
        try:
            await ready  # no wait once it has started
        except BaseException:
            await self._forget(worker)
            raise
        return worker

    async def _forget(self, worker: billing_worker.Worker) -> None:
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
        charged = _told(ask, held)
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

    def _ready_worker(self) -> billing_worker.Worker | None:
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
        if isinstance(answer, billing_worker.WorkerDied):
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
            except billing_worker.WorkerDied as died:
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
                else:
                    held_forget(ask.request_id)
                if not isinstance(ask, HoldAsk):  # an end: booked, or kept until it is (gateway.unbooked)
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
                                reason=str(Outcome.CANCELLED),
                                at=_now(),
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


def _budget_error(exc: BudgetExhausted) -> GatewayError:
    return GatewayError(402, ErrorCode.BUDGET_EXHAUSTED, f"{exc} Ask finance to raise it, or use a cheaper class.")


def _submit_hold(
    asked: Hold,
    *,
    fallback: bool,
    urgent: bool = True,
    priced_at: datetime | None = None,
    hold_cap: Decimal | None = None,
) -> asyncio.Future:
    return booker().submit(
        HoldAsk(
            request_id=asked.request_id,
            tenant_slug=asked.tenant,
            class_name=asked.cls,
            model=asked.model,
            prompt_tokens=asked.prompt_tokens,
            max_output_tokens=asked.max_output_tokens,
            at=_now(),
            fallback=fallback,
            owner=process_owner(),
            priced_at=priced_at,
            hold_cap=hold_cap,
        ),
        urgent=urgent,
    )


def _id_refused(asked: Hold, *, served: bool) -> GatewayError:
    public_id = public_id_of(asked.request_id)
    why = (
        "was used by an earlier request that was served; send a new one"
        if served
        else "is already in use by one of your live requests"
    )
    return invalid_request(f"X-Request-Id '{public_id}' {why}.")


async def _held(asked: Hold, future: asyncio.Future) -> Hold:
    """The hold once booked; a refusal as the GatewayError the client gets. A client that leaves
    meanwhile cancels ``future``: the Booker releases the hold once it is booked; one that leaves
    as it was booked (its answer in, this task not resumed yet) has it released here."""
    try:
        held: HeldEntry = await future
    except asyncio.CancelledError:
        if future.cancelled():
            booker().release_pending(asked.request_id)
        else:
            _release_booked(future, str(Outcome.CANCELLED))
        raise
    except BudgetExhausted as exhausted:
        raise _budget_error(exhausted) from None
    except (RequestIdUsed, RequestIdInUse) as taken:
        raise _id_refused(asked, served=isinstance(taken, RequestIdUsed)) from None
    return Hold(  # (not dataclasses.replace: several times slower, on every request)
        asked.tenant,
        held.request_id,
        held.class_name,
        asked.model,
        asked.prompt_tokens,
        asked.max_output_tokens,
        held.amount,
        held.class_name != asked.cls,
        held.factor,
    )


async def hold(
    *,
    tenant: str,
    request_id: str,
    cls: str,
    model: str,
    prompt_tokens: int,
    max_output_tokens: int,
    priced_at: datetime | None = None,
    hold_cap: Decimal | None = None,
) -> Hold:
    """The hold, booked: the request may go on. Refused: 402 (or a cheaper class, see above).
    ``priced_at``: the time whose prices apply (a batch line's: its batch's creation); None: now.
    ``hold_cap``: the most it is held (a batch line's part of its batch's cost bound)."""
    asked = Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)
    if not settings.FAIRGATE_BILLING:
        return asked
    if booker().unbooked.journal.settling(request_id):  # served here a moment ago: not booked yet
        raise _id_refused(asked, served=True)
    await booker().releases_sent(request_id)  # an earlier request of this id ended: its release first
    future = _submit_hold(asked, fallback=True, priced_at=priced_at, hold_cap=hold_cap)
    future.add_done_callback(_noting(tenant, prompt_tokens + max_output_tokens))
    return await _held(asked, future)


# --- early holds ------------------------------------------------------------------------------
#
# A request whose tenant has ample room need not wait for its hold before it queues and goes
# upstream: the hold is booked meanwhile (``hold_early``), and the request's answer waits for it
# before its first byte (gateway.exchange). Refused then (the room was spent by other processes
# since, or a price went up), the upstream is abandoned, nothing reaches the client and nothing
# is charged, and the request is admitted again the usual way: hold first (a 402, or a cheaper
# class for a tenant set to fall back). Every guarantee of the ledger is unchanged (a hold is
# booked before anything is served; ``spent + held <= limit``); what early holds cost is backend
# work spent on requests refused late, which the room margin below keeps to races.


class EarlyHoldRefused(Exception):
    """An early hold was refused for the budget: admit the request again, hold first."""


@dataclass
class _Room:
    left: Decimal  # after the last hold booked for the tenant by this process (Infinity: no limit)
    known_at_s: float
    rate: Decimal  # the highest amount per token of its holds seen (classes and models price differently)
    early: Decimal = ZERO  # estimates of this process's early holds not answered yet


class Rooms:
    """What this process knows of each tenant's budget room, from the holds it booked.

    A request may be held early when the room last reported, less the estimates of the early
    holds still being booked, is at least ``MARGIN`` times its own estimate (the tenant's highest
    amount per token seen, times the tokens it holds), and that report is at most
    ``FAIRGATE_EARLY_HOLD_ROOM_MS`` old. A tenant not seen yet, or last refused, is held first."""

    MARGIN = 4

    def __init__(self) -> None:
        self._rooms: dict[str, _Room] = {}

    def learn(self, tenant: str, tokens: int, held: HeldEntry, now_s: float) -> None:
        if held.room is None:  # an open hold found again: says nothing of the room
            return
        rate = held.amount / max(tokens, 1)
        room = self._rooms.get(tenant)
        if room is None:
            self._rooms[tenant] = _Room(held.room, now_s, rate)
        else:
            room.left, room.known_at_s, room.rate = held.room, now_s, max(room.rate, rate)

    def refused(self, tenant: str, now_s: float) -> None:
        room = self._rooms.get(tenant)
        if room is not None:
            room.left, room.known_at_s = ZERO, now_s

    def early_estimate(self, tenant: str, tokens: int, now_s: float) -> Decimal | None:
        """The estimate to count while this request's hold is booked early; None: hold it first."""
        room = self._rooms.get(tenant)
        if room is None or (now_s - room.known_at_s) * 1000 > settings.FAIRGATE_EARLY_HOLD_ROOM_MS:
            return None
        estimate = room.rate * tokens
        if room.left - room.early < self.MARGIN * estimate:
            return None
        room.early += estimate
        return estimate

    def early_answered(self, tenant: str, estimate: Decimal) -> None:
        room = self._rooms.get(tenant)
        if room is not None:
            room.early = max(room.early - estimate, ZERO)

    def clear(self) -> None:
        self._rooms.clear()


rooms = Rooms()


class EarlyHold:
    """A hold being booked while its request waits for a slot and its upstream works."""

    def __init__(self, asked: Hold, future: asyncio.Future) -> None:
        self.asked = asked
        self.future = future

    async def booked(self) -> Hold:
        """The hold once booked (usually it is by now); a refusal as its GatewayError."""
        if not self.future.done():
            booker().hurry()
        return await _held(self.asked, self.future)

    def release(self, reason: str) -> None:
        """The request ended before its hold was confirmed: released once it is booked."""
        if not self.future.done():
            booker().release_pending(self.asked.request_id)
        self.future.add_done_callback(lambda future: _release_booked(future, reason, self.asked.request_id))


def _release_booked(future: asyncio.Future, reason: str, request_id: str | None = None) -> None:
    """Releases the hold ``future`` booked, if it booked one (cancelled: the Booker releases it);
    ``request_id``: the release that was pending for it is sent."""
    if not (future.cancelled() or future.exception() is not None):
        held: HeldEntry = future.result()
        booker().submit(
            ReleaseAsk(request_id=held.request_id, reason=reason, at=_now(), held=held),
            answer=False,
            urgent=False,
        )
    if request_id is not None and not future.cancelled():  # cancelled: the Booker ends the wait
        booker().release_sent(request_id)


_EARLY_BOOKED = metrics.BILLING_EARLY_HOLDS.labels("booked")  # (bound once: labels() costs on every hold)
_EARLY_REFUSED = metrics.BILLING_EARLY_HOLDS.labels("refused")


def _noting(tenant: str, tokens: int, *, early: Decimal | None = None) -> Callable[[asyncio.Future], None]:
    """What a hold's answer tells ``rooms`` (and, for an early hold, the metric of early holds)."""

    def note(done: asyncio.Future) -> None:
        if early is not None:
            rooms.early_answered(tenant, early)
        if done.cancelled():
            return
        outcome = done.exception() or done.result()
        if isinstance(outcome, HeldEntry):
            rooms.learn(tenant, tokens, outcome, time.monotonic())
        elif isinstance(outcome, BudgetExhausted):
            rooms.refused(tenant, time.monotonic())
        if early is not None:
            (_EARLY_BOOKED if isinstance(outcome, HeldEntry) else _EARLY_REFUSED).inc()

    return note


def hold_early(
    *,
    tenant: str,
    request_id: str,
    cls: str,
    model: str,
    prompt_tokens: int,
    max_output_tokens: int,
    priced_at: datetime | None = None,
    hold_cap: Decimal | None = None,
) -> EarlyHold | None:
    """Starts booking the hold and returns at once, if the tenant's room allows (see Rooms); else
    None: ``hold`` it first. Never falls back to a cheaper class (the request is already on its way)."""
    if not (settings.FAIRGATE_BILLING and settings.FAIRGATE_EARLY_HOLDS):
        return None
    if booker().unbooked.journal.settling(request_id):  # refused by `hold`, before anything goes upstream
        return None
    if booker().releasing(request_id):  # `hold` waits for that release first
        return None
    tokens = prompt_tokens + max_output_tokens
    estimate = rooms.early_estimate(tenant, tokens, time.monotonic())
    if estimate is None:
        return None
    asked = Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)
    future = _submit_hold(asked, fallback=False, urgent=False, priced_at=priced_at, hold_cap=hold_cap)  # waited for
    future.add_done_callback(_noting(tenant, tokens, early=estimate))
    return EarlyHold(asked, future)


def settle(
    held: Hold, *, backend: str, prompt_tokens: int, output_tokens: int, partial: bool = False
) -> asyncio.Future | None:
    """Sends the settlement now. The future gives the ``Charged`` once the settlement is journaled
    (`Booker.settle`); it is booked whether or not anyone waits. ``partial``: a stream the client
    abandoned, charged for the tokens sent."""
    if not settings.FAIRGATE_BILLING:
        return None
    books = booker()
    unit = books.prices.get(backend)  # priced here only with the prices the booking would use
    base = None if unit is None else unit.base_cost(prompt_tokens=prompt_tokens, completion_tokens=output_tokens)
    ask = SettleAsk(
        request_id=held.request_id,
        backend_name=backend,
        prompt_tokens=prompt_tokens,
        completion_tokens=output_tokens,
        at=_now(),
        base_cost=base,
    )  # without its hold: the billing worker that booked it remembers it (billing.worker)
    return books.settle(ask, held)


def release_leftover_holds() -> None:
    """At start (synchronous: through gateway.db): holds of requests a previous run of this process
    never ended (crash, kill) hold no more."""
    if settings.FAIRGATE_BILLING:
        released = holds_release_at_startup(sole_process=not settings.REDIS_URL)
        if released:
            log.warning("released %d billing holds left behind by an earlier run", released)


def forget(held: Hold) -> None:
    """The hold is another process's to end now: out of this process's memo of holds."""
    if settings.FAIRGATE_BILLING:
        held_forget(held.request_id)


def release(held: Hold | EarlyHold, *, reason: str) -> None:
    """Sends the release now (an early hold's once it is booked); one that fails is retried while
    the process lives (gateway.unbooked)."""
    if not settings.FAIRGATE_BILLING:
        return
    reason = str(reason)  # a plain str to billing (an outcome may be one of gateway.errors' codes)
    if isinstance(held, EarlyHold):
        held.release(reason)
    else:
        booker().submit(
            ReleaseAsk(request_id=held.request_id, reason=reason, at=_now()),  # its hold: as for a settlement
            answer=False,
            urgent=False,
        )
