"""The billing seam of the request path: hold, settle, release, booked by group commit.

* ``hold`` before admission, with the estimate; raises ``GatewayError(402 budget_exhausted)``
  unless the tenant is configured to fall back to a cheaper class that fits (then the returned
  hold names that class, and the gateway shows ``rule=budget``);
* ``settle`` once, when the upstream finished, with the actual usage (for a stream the client
  abandoned: the tokens sent so far, ``partial=True``); returns the charge once it is booked;
* ``release`` once, when the request ends without a charge (refused, queue timeout, cancelled
  while waiting, upstream failure).

Exactly one of ``settle``/``release`` follows every ``hold`` that returned; the gateway runs
them shielded from cancellation, so a client disconnect never leaks a hold (nor does a client
that leaves while its hold is being booked: the hold is released once booked).

Group commit: every ask goes to one ``Booker`` per process. While a batch is being written in
the booker's own thread (``billing.booking.book``: one transaction), new asks wait in a list;
when it ends they all go in the next one. An idle gateway therefore books an ask at once, on
its own; a busy one books hundreds per transaction, which is what keeps billing cheap at
high rates. Every caller still waits for its own ask to commit: a 402 or an ``X-Charge`` is
never given for a booking that could still be lost. ``FAIRGATE_BILLING=0`` turns the seam into
no-ops (used by the benchmark that measures billing's cost).
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from decimal import Decimal

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from billing.booking import Ask, HoldAsk, ReleaseAsk, SettleAsk, book
from billing.errors import BillingError, BudgetExhausted, RequestIdUsed
from billing.inflight import HeldEntry
from gateway import metrics
from gateway.errors import GatewayError, invalid_request

log = logging.getLogger(__name__)
BUDGET_RULE = "budget"


@dataclass(frozen=True)
class Hold:
    """What was held for one request. ``cls`` may be lower than asked (budget fallback)."""

    tenant: str
    request_id: str  # the engine id (tenant/public id): unique across tenants
    cls: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    amount: Decimal | None = None
    fallback: bool = False


class Booker:
    """Collects asks on the event loop and books them in batches in one worker thread."""

    def __init__(self) -> None:
        self._pending: list[tuple[Ask, asyncio.Future]] = []
        self._writing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="billing")

    def submit(self, ask: Ask) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): what the old one left cannot be answered
            self._loop, self._pending, self._writing = loop, [], False
        future = loop.create_future()
        self._pending.append((ask, future))
        if not self._writing:
            self._writing = True
            loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                started_s = loop.time()
                try:
                    results = await loop.run_in_executor(self._thread, _book_in_thread, [ask for ask, _ in batch])
                except BaseException as failed:  # the whole batch: every caller gets the error
                    log.exception("billing batch of %s failed", len(batch))
                    results = [failed] * len(batch)
                metrics.BILLING_BATCH_SECONDS.observe(loop.time() - started_s)
                metrics.BILLING_BATCH_ASKS.observe(len(batch))
                for (_, future), result in zip(batch, results):
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._writing = False


def _book_in_thread(asks: list[Ask]) -> list[object]:
    close_old_connections()  # the thread's connection: recycle a stale or expired one
    return book(asks)


_booker: Booker | None = None


def booker() -> Booker:
    global _booker
    if _booker is None:
        _booker = Booker()
    return _booker


def _budget_error(exc: BudgetExhausted) -> GatewayError:
    return GatewayError(402, "budget_exhausted", f"{exc} Ask finance to raise it, or use a cheaper class.")


def _release_if_held(future: asyncio.Future) -> None:
    """The client left while its hold was being booked: give the hold back."""
    if not future.cancelled() and future.exception() is None:
        held: HeldEntry = future.result()
        booker().submit(ReleaseAsk(request_id=held.request_id, reason="cancelled", at=timezone.now()))


async def hold(*, tenant: str, request_id: str, cls: str, model: str, prompt_tokens: int,
               max_output_tokens: int) -> Hold:
    asked = Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)
    if not settings.FAIRGATE_BILLING:
        return asked
    future = booker().submit(HoldAsk(request_id=request_id, tenant_slug=tenant, class_name=cls, model=model,
                                     prompt_tokens=prompt_tokens, max_output_tokens=max_output_tokens,
                                     at=timezone.now(), fallback=True))
    try:
        held: HeldEntry = await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_release_if_held)
        raise
    except BudgetExhausted as exhausted:
        raise _budget_error(exhausted) from None
    except RequestIdUsed:
        public_id = request_id.split("/", 1)[-1]
        raise invalid_request(f"X-Request-Id '{public_id}' was used by an earlier request; send a new one.") from None
    return replace(asked, cls=held.class_name, amount=held.amount, fallback=held.class_name != cls)


async def settle(held: Hold, *, backend: str, prompt_tokens: int, output_tokens: int,
                 partial: bool = False) -> Decimal | None:
    if not settings.FAIRGATE_BILLING:
        return None
    try:
        return await booker().submit(SettleAsk(request_id=held.request_id, backend_name=backend,
                                               prompt_tokens=prompt_tokens, completion_tokens=output_tokens,
                                               at=timezone.now()))
    except BillingError:
        log.exception("could not settle %s (partial=%s); the stale-hold sweep will release it",
                      held.request_id, partial)
        return None


async def release(held: Hold, *, reason: str) -> None:
    if not settings.FAIRGATE_BILLING:
        return
    await booker().submit(ReleaseAsk(request_id=held.request_id, reason=reason, at=timezone.now()))
