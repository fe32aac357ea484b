"""Batch lines into the engine: every ``serve`` process feeds lines as its engine takes them.

Each tick (`FEED_S`) the feeder claims pending lines (batches.service.lines_claim) and admits each
as the gateway admits an HTTP request, with its batch's window end as its deadline. On its grant
a line is marked sent and handed to a Celery worker (batches.tasks.run_line), which owns its money
from then on; the feeder frees the slot when the line ends. Lines of a dead process go back to
their batch (batches.service.requeue_lines_of_gone_processes; sent ones: batches.leases).
How lines run: docs/batches.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from batches import leases, metrics, service, tasks
from batches.db import batch_db_call
from batches.lines import line_payload
from batches.models import BatchLine
from batches.prices import batch_priced_at, line_hold_cap
from billing.client import process_owner
from gateway.api import (
    EMBED,
    Asked,
    Bill,
    ErrorCode,
    GatewayError,
    Hold,
    Outcome,
    PublicId,
    admit_with_hold,
    caller_of,
    classify,
    dispatcher_get,
    log_failure,
    output_tokens_held,
    payload_estimate,
    spawn,
)

log = logging.getLogger(__name__)
FEED_S = 0.2
WATCH_S = 0.05  # sent lines are watched for their ends this often
IDLE_FEED_S = 1.0  # while no batch has lines to feed: a tick a second, not five
FINALIZE_S = 1.0
FINALIZE_RESEND_S = 30.0  # a batch still not finalized this long after its task was sent: sent again
FULL_PAUSE_S = 1.0  # after the engine refused a line for room
State = BatchLine.State
_sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-send")  # one kombu producer at a time


def failed_early(code: str, *, expires_at_s: float, now_s: float) -> bool:
    """An engine's ``queue_timeout`` before the batch's window ended: early fast-fail (the engine
    predicted the line could not start before its deadline), not the line's end: it goes back to its
    batch, as it does when the engine stops, and is fed again later (or expires with its batch)."""
    return code == ErrorCode.QUEUE_TIMEOUT and now_s < expires_at_s


async def _send_task(task, *args: object) -> None:
    """Sends ``task`` to the broker, off the event loop (one kombu producer at a time). In eager
    mode (no broker) the task runs right there, in a thread of its own."""
    apply = functools.partial(task.apply_async, args=list(args))
    if task.app.conf.task_always_eager:
        await asyncio.to_thread(apply)
    else:
        await asyncio.get_running_loop().run_in_executor(_sender, apply)


async def _hand_to_worker(line_pk: int, send: int) -> None:
    """Sends the line's task (send ``send`` of it). A broker that refuses is logged: the line's
    lease lapses, and it is sent again."""
    try:
        await _send_task(tasks.run_line, line_pk, send)
    except Exception:
        log_failure(log, "batch line %s could not be handed to the workers; it is sent again later", line_pk)


async def _finalize_elsewhere(batch_pk: str) -> None:
    """A batch with no line left to run goes to a worker to be finalized (its files built from
    every line: seconds of CPU for a large one, which in this process would hold the GIL against
    the event loop). A broker that refuses is logged: it is sent again later, and beat's sweep
    finalizes it too."""
    try:
        await _send_task(tasks.finalize, batch_pk)
    except Exception:
        log_failure(log, "batch %s could not be handed to the workers to finalize; it is sent again later", batch_pk)


class Feeder:
    def __init__(self) -> None:
        self.lines: dict[int, asyncio.Task] = {}  # line pk -> its task, while here
        self.waiting: dict[int, asyncio.Future] = {}  # sent lines: pk -> the worker's end
        self.paused_until_s = 0.0
        self.finalized_at_s = 0.0
        self.finalize_sent: dict[str, float] = {}  # batch pk -> when its finalize task was sent
        self.tallied_at_s = 0.0
        self.claimed_after = ""  # the last batch claimed from: the next claim starts after it
        self.tallied_quiet = False  # counted since the last open batch ended
        self.idle = False  # the last claim found nothing, and nothing is here

    async def run(self) -> None:
        watching = spawn(self.watch())
        try:
            while True:
                await asyncio.sleep(IDLE_FEED_S if self.idle else FEED_S)
                try:
                    await self.tick()
                except Exception:
                    log_failure(log, "the batch feeder's tick failed")
        finally:
            watching.cancel()

    async def watch(self) -> None:
        """Its sent lines, every WATCH_S: a line a worker ended frees its slot at once (a slot
        held after its line ended is a slot no interactive request can have), a lapsed one is
        sent again."""
        while True:
            await asyncio.sleep(WATCH_S)
            if not self.waiting:
                continue
            try:
                await self._watched()
            except Exception:
                log_failure(log, "the batch feeder's watch of its sent lines failed")

    async def _watched(self) -> None:
        ended, again = await batch_db_call(leases.lines_watch)(list(self.waiting))
        for pk, end in ended.items():
            waiter = self.waiting.pop(pk, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(end)
        for pk, send in again:
            metrics.RESENT.inc()
            await _hand_to_worker(pk, send)

    async def tick(self) -> None:
        now_s = time.monotonic()
        if self.idle and not self.lines and not await batch_db_call(service.batches_open)():
            if not self.tallied_quiet:  # no batch is open anywhere: the counts stay as they are
                self.tallied_quiet = True
                await batch_db_call(metrics.refresh)()
            return  # one small query a second, not the claim, finalize and tally queries
        self.tallied_quiet = False
        room = settings.FAIRGATE_BATCH_LINES_PER_PROCESS - len(self.lines)
        if room > 0 and now_s >= self.paused_until_s:
            claimed = await batch_db_call(service.lines_claim)(
                owner=process_owner(), room=room, after=self.claimed_after
            )
            if claimed:
                self.claimed_after = max(line.batch_id for line in claimed)
            for line in claimed:
                task = spawn(self._line(line))
                self.lines[line.pk] = task
                task.add_done_callback(functools.partial(self._gone, line.pk))
            self.idle = not claimed and not self.lines
        queued = [pk for pk in self.lines if pk not in self.waiting]
        if queued:
            for pk in await batch_db_call(service.batches_cancelled)(queued):
                if pk in self.lines and pk not in self.waiting:  # not sent meanwhile: a sent line is the worker's
                    self.lines[pk].cancel()
        if now_s - self.finalized_at_s >= FINALIZE_S:
            self.finalized_at_s = now_s
            ready = await batch_db_call(service.batches_ready)()
            self.finalize_sent = {b: at_s for b, at_s in self.finalize_sent.items() if b in ready}
            for batch_pk in ready:
                if now_s - self.finalize_sent.get(batch_pk, -FINALIZE_RESEND_S) >= FINALIZE_RESEND_S:
                    self.finalize_sent[batch_pk] = now_s
                    spawn(_finalize_elsewhere(batch_pk))
        if now_s - self.tallied_at_s >= metrics.TALLY_S:
            self.tallied_at_s = now_s
            await batch_db_call(metrics.refresh)()

    def _gone(self, pk: int, _task: asyncio.Task) -> None:
        self.lines.pop(pk, None)

    async def _asked(self, line: BatchLine) -> Asked:
        batch = line.batch
        caller = await caller_of(batch.key_prefix)
        if caller is None:
            raise GatewayError(401, ErrorCode.INVALID_API_KEY, "The key that created the batch was revoked.")
        payload = line_payload(line)
        if line.estimated_tokens is None:  # a line made without its upload's check
            await payload_estimate(payload)
        d = await dispatcher_get()
        d.check_model(payload.model, embeddings=payload.kind == EMBED)  # still served? (503: not now)
        cls, rule = classify(d, caller, batch.priority_class, payload, None)
        left_ms = int((batch.expires_at.timestamp() - time.time()) * 1000)
        return Asked(
            d,
            caller,
            PublicId(service.public_id_of(line)),
            payload,
            batch.priority_class,
            cls,
            rule,
            max(1, left_ms),
            priced_at=batch_priced_at(batch),  # its cost bound's prices, whatever they are now
            hold_cap=line_hold_cap(  # its part of the cost bound, whatever the backends' prices are now
                batch,
                model=payload.model,
                prompt_tokens=payload.prompt_bound,
                output_tokens=output_tokens_held(payload),
            ),
            batch_id=batch.id,
        )

    async def _line(self, line: BatchLine) -> None:
        try:
            asked = await self._asked(line)
            admitted = await admit_with_hold(asked, early=False)
        except GatewayError as refused:
            if refused.status in (429, 503):  # no room in the engine, or no backend, now: fed later
                self.paused_until_s = time.monotonic() + FULL_PAUSE_S
                await batch_db_call(service.line_unclaim)(line.pk)
            else:
                await _ended(line.pk, State.FAILED, refused.code, refused.message)
            return
        except asyncio.CancelledError:  # before its hold or admission: nothing of it is held now
            spawn(batch_db_call(service.line_drop)(line.pk))
            raise
        except Exception:
            log_failure(log, "batch line %s could not be admitted; it goes back to its batch", line.pk)
            spawn(batch_db_call(service.line_drop)(line.pk))
            return
        d, entry, bill = asked.d, admitted.entry, admitted.bill
        try:
            grant = await d.wait_for_grant(entry)
        except GatewayError as refused:  # its deadline (the batch's window) passed, or the engine stops
            d.end(entry, refused.code)
            bill.end(refused.code, served=False)
            if refused.status == 503:  # the gateway is shutting down (or lost its backends): not the line's end
                await batch_db_call(service.line_drop)(line.pk)
                return
            if failed_early(refused.code, expires_at_s=line.batch.expires_at.timestamp(), now_s=time.time()):
                self.paused_until_s = time.monotonic() + FULL_PAUSE_S  # its class cannot take it in time now
                await batch_db_call(service.line_drop)(line.pk)
                return
            state = State.EXPIRED if refused.code == ErrorCode.QUEUE_TIMEOUT else State.FAILED
            await _ended(line.pk, state, refused.code, refused.message)
            return
        except asyncio.CancelledError:  # its batch was cancelled (or this process stops)
            d.end(entry, Outcome.CANCELLED)
            bill.end(Outcome.CANCELLED, served=False)
            spawn(batch_db_call(service.line_drop)(line.pk))
            raise
        # Granted: from here on nothing may stop half-way (a cancel now is too late for this line).
        await asyncio.shield(spawn(self._granted(line.pk, d, entry, bill, grant.backend)))

    async def _granted(self, pk: int, d, entry, bill: Bill, backend: str) -> None:
        assert isinstance(bill.held, Hold)  # admitted with early=False: booked
        send = await batch_db_call(leases.line_sent)(pk, backend, bill.held.request_id)
        if not send:  # its batch was cancelled
            d.end(entry, Outcome.CANCELLED)
            bill.end(Outcome.CANCELLED, served=False)
            await _ended(pk, State.CANCELLED, "batch_cancelled", "The batch was cancelled.")
            return
        bill.end_elsewhere()  # the worker settles or releases it
        waiter = asyncio.get_running_loop().create_future()
        self.waiting[pk] = waiter
        await _hand_to_worker(pk, send)
        state, prompt_tokens, output_tokens = await waiter  # the slot is the line's until it ends (its lease)
        served = state == State.COMPLETED
        d.end(
            entry,
            Outcome.COMPLETED if served else ErrorCode.UPSTREAM_ERROR,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            served=served,
        )


async def _ended(pk: int, state: str, code: str, message: str) -> None:
    await batch_db_call(service.line_end)(pk, state, {"code": str(code), "message": message})


_running: asyncio.Task | None = None


def start() -> None:
    """The serving process's feeder (gateway.live: beside the dispatcher)."""
    global _running
    _running = spawn(Feeder().run())


async def stop() -> None:
    """Before the dispatcher stops: no more ticks (lines claimed here go back once billing has
    released this process's holds: batches.service.requeue_lines_of_gone_processes)."""
    global _running
    running, _running = _running, None
    if running is not None:
        running.cancel()
        await asyncio.wait([running])
