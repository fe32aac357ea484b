"""The billing port's implementation (billing.client.port): holds, early holds, settlements,
releases and forgets, each handed to this process's Booker (billing.client.group_commit) at once,
without a task, so a client that leaves never leaks a hold. ``FAIRGATE_BILLING=0`` turns them
into no-ops. What each guarantees: docs/money.md; how: docs/billing-and-console.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings

from billing.booking_asks import HoldAsk, ReleaseAsk, SettleAsk
from billing.client import metrics
from billing.client.group_commit import booker, now_utc
from billing.client.port import CANCELLED, NOBODY, Hold, PendingHold, Spender
from billing.errors import BudgetExhausted, RequestIdUsed
from billing.heartbeats import process_owner
from billing.inflight import HeldEntry, held_forget
from billing.money import ZERO
from billing.tasks import holds_release_at_startup

log = logging.getLogger("gateway.charging")  # the name its log lines have always had (operators' filters)


def _submit_hold(
    asked: Hold,
    *,
    fallback: bool,
    urgent: bool = True,
    priced_at: datetime | None = None,
    hold_cap: Decimal | None = None,
    spender: Spender = NOBODY,
) -> asyncio.Future:
    return booker().submit(
        HoldAsk(
            request_id=asked.request_id,
            tenant_slug=asked.tenant,
            class_name=asked.cls,
            model=asked.model,
            prompt_tokens=asked.prompt_tokens,
            max_output_tokens=asked.max_output_tokens,
            at=now_utc(),
            fallback=fallback,
            owner=process_owner(),
            priced_at=priced_at,
            hold_cap=hold_cap,
            key_prefix=spender.key_prefix,
            job_id=spender.job_id,
            key_creator=spender.key_creator,
        ),
        urgent=urgent,
    )


async def _held(asked: Hold, future: asyncio.Future) -> Hold:
    """The hold once booked; a refusal raised as billing's error. A client that leaves
    meanwhile cancels ``future``: the Booker releases the hold once it is booked; one that leaves
    as it was booked (its answer in, this task not resumed yet) has it released here."""
    try:
        held: HeldEntry = await future
    except asyncio.CancelledError:
        if future.cancelled():
            booker().release_pending(asked.request_id)
        else:
            _release_booked(future, CANCELLED)
        raise
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
    spender: Spender = NOBODY,
) -> Hold:
    """The hold, booked: the request may go on. Refused: BudgetExhausted (or, for a tenant set to
    fall back, a hold of a cheaper class: ``fallback``), RequestIdUsed, RequestIdInUse.
    ``priced_at``: the time whose prices apply (a batch line's: its batch's creation); None: now.
    ``hold_cap``: the most it is held (a batch line's part of its batch's cost bound).
    ``spender``: the key, job and key creator its ledger entries record."""
    asked = Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)
    if not settings.FAIRGATE_BILLING:
        return asked
    if booker().unbooked.journal.settling(request_id):  # served here a moment ago: not booked yet
        raise RequestIdUsed(f"request id {request_id} was served here; its settlement is not booked yet")
    await booker().releases_sent(request_id)  # an earlier request of this id ended: its release first
    future = _submit_hold(asked, fallback=True, priced_at=priced_at, hold_cap=hold_cap, spender=spender)
    future.add_done_callback(_recorder_of_hold_answer(tenant, prompt_tokens + max_output_tokens))
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


@dataclass
class _Room:
    left: Decimal  # after the last hold booked for the tenant by this process (Infinity: no limit)
    known_at_s: float
    rate: Decimal  # the highest amount per token of its holds seen (classes and models price differently)
    early: Decimal = ZERO  # estimates of this process's early holds not answered yet


class BudgetRoomMemo:
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


budget_room_memo = BudgetRoomMemo()


class EarlyHold:
    """A hold being booked while its request waits for a slot and its upstream works."""

    def __init__(self, asked: Hold, future: asyncio.Future) -> None:
        self.asked = asked
        self.future = future

    async def booked(self) -> Hold:
        """The hold once booked (usually it is by now); a refusal as billing's error."""
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
            ReleaseAsk(request_id=held.request_id, reason=reason, at=now_utc(), held=held),
            answer=False,
            urgent=False,
        )
    if request_id is not None and not future.cancelled():  # cancelled: the Booker ends the wait
        booker().release_sent(request_id)


_EARLY_BOOKED = metrics.BILLING_EARLY_HOLDS.labels("booked")  # (bound once: labels() costs on every hold)
_EARLY_REFUSED = metrics.BILLING_EARLY_HOLDS.labels("refused")


def _recorder_of_hold_answer(
    tenant: str, tokens: int, *, early: Decimal | None = None
) -> Callable[[asyncio.Future], None]:
    """What a hold's answer tells ``budget_room_memo`` (and, for an early hold, the metric of early holds)."""

    def note(done: asyncio.Future) -> None:
        if early is not None:
            budget_room_memo.early_answered(tenant, early)
        if done.cancelled():
            return
        outcome = done.exception() or done.result()
        if isinstance(outcome, HeldEntry):
            budget_room_memo.learn(tenant, tokens, outcome, time.monotonic())
        elif isinstance(outcome, BudgetExhausted):
            budget_room_memo.refused(tenant, time.monotonic())
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
    spender: Spender = NOBODY,
) -> EarlyHold | None:
    """Starts booking the hold and returns at once, if the tenant's room allows (see BudgetRoomMemo); else
    None: ``hold`` it first. Never falls back to a cheaper class (the request is already on its way)."""
    if not (settings.FAIRGATE_BILLING and settings.FAIRGATE_EARLY_HOLDS):
        return None
    if booker().unbooked.journal.settling(request_id):  # refused by `hold`, before anything goes upstream
        return None
    if booker().releasing(request_id):  # `hold` waits for that release first
        return None
    tokens = prompt_tokens + max_output_tokens
    estimate = budget_room_memo.early_estimate(tenant, tokens, time.monotonic())
    if estimate is None:
        return None
    asked = Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)
    future = _submit_hold(  # waited for
        asked, fallback=False, urgent=False, priced_at=priced_at, hold_cap=hold_cap, spender=spender
    )
    future.add_done_callback(_recorder_of_hold_answer(tenant, tokens, early=estimate))
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
        at=now_utc(),
        base_cost=base,
    )  # without its hold: the billing worker that booked it remembers it (billing.worker_loop)
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


def release(held: Hold | PendingHold, *, reason: str) -> None:
    """Sends the release now (an early hold's once it is booked); one that fails is retried while
    the process lives (billing.client.unbooked)."""
    if not settings.FAIRGATE_BILLING:
        return
    reason = str(reason)  # a plain str to billing (an outcome may be one of gateway.errors' codes)
    if isinstance(held, Hold):
        booker().submit(
            ReleaseAsk(request_id=held.request_id, reason=reason, at=now_utc()),  # its hold: as for a settlement
            answer=False,
            urgent=False,
        )
    else:  # an early hold
        held.release(reason)
