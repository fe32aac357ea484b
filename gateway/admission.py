"""A request's admission and its bill: the one place that answers "what happens to the money".

`admit` takes a request that intake accepted through its billing saga: hold (early when the
tenant has ample room, else first: 402), fall back to the cheaper class the hold names, admit it
to the engine, and on any refusal after the hold release it. What it returns carries the
request's `Bill`: settle or release is decided once, at its end (`Bill.end`); an early hold is
confirmed (`Bill.confirm`) before the upstream's answer is read. Early holds:
docs/billing-and-console.md.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, TypedDict

from gateway import charging, metrics
from gateway.dispatch_core import Entry
from gateway.errors import GatewayError
from gateway.lifecycle import Outcome, job_of
from gateway.limits import output_tokens_held
from gateway.port import SchedulerPort
from scheduling.engine.model import Request

if TYPE_CHECKING:
    from gateway.intake import Asked


_WAITED_HOLD = metrics.BILLING_WAIT_SECONDS.labels("hold")  # (bound once: labels() costs on every call)
_WAITED_SETTLEMENT = metrics.BILLING_WAIT_SECONDS.labels("settlement")


class Bill:
    """A request's billing hold, from admission to its one end."""

    def __init__(self, held: charging.Hold | charging.EarlyHold) -> None:
        self.held = held  # an EarlyHold until `confirm`, which is before any of the answer is read
        self.ended = False
        self.settlement: asyncio.Future | None = None  # the Charged of a served request, once journaled

    @property
    def confirmed(self) -> bool:
        return isinstance(self.held, charging.Hold)

    async def confirm(self) -> None:
        """An early hold, booked (usually it is by now). Refused (a GatewayError: the budget, an id
        already used), nothing was held: the bill is ended, and the refusal raised."""
        if isinstance(self.held, charging.EarlyHold):
            waits_s = None if self.held.future.done() else time.monotonic()
            try:
                self.held = await charging.booked(self.held)
            except GatewayError:
                self.ended = True
                raise
            finally:
                if waits_s is not None:
                    _WAITED_HOLD.observe(time.monotonic() - waits_s)

    async def settled(self) -> charging.Charged | None:
        """The settlement's Charged once its journal line is written (or synced: billing.journal;
        None: booked but its charge unknown here). Only after `end` of a served request."""
        assert self.settlement is not None
        if self.settlement.done():
            return self.settlement.result()
        waits_s = time.monotonic()
        try:
            return await self.settlement
        finally:
            _WAITED_SETTLEMENT.observe(time.monotonic() - waits_s)

    def end(
        self, outcome: str, *, served: bool, backend: str = "", usage: tuple[int, int] = (0, 0), partial: bool = False
    ) -> None:
        """Once: settled with ``usage`` if the request was served (its answer, or part of a stream,
        reached the client), else released. Later calls do nothing."""
        if self.ended:
            return
        self.ended = True
        if served:
            assert isinstance(self.held, charging.Hold), "served before its hold was confirmed"
            prompt_tokens, output_tokens = usage
            self.settlement = charging.settle(
                self.held, backend=backend, prompt_tokens=prompt_tokens, output_tokens=output_tokens, partial=partial
            )
        else:
            charging.release(self.held, reason=outcome)

    def end_elsewhere(self) -> None:
        """Once: another process settles or releases the hold (a Celery worker runs the request:
        batches.tasks); this one only forgets it."""
        if not self.ended:
            self.ended = True
            assert isinstance(self.held, charging.Hold), "handed on before its hold was confirmed"
            charging.forget(self.held)


@dataclass
class Admitted:
    """A request in the engine's queue, with its bill and the headers every answer carries."""

    d: SchedulerPort
    entry: Entry
    bill: Bill
    headers: dict[str, str]  # Fairgate's: id, class, downgrade


def _headers(asked: Asked, cls: str, rule: str | None) -> dict[str, str]:
    """The answer's headers; a downgrade is recorded here, once per request (also when admitted again)."""
    headers = {"X-Request-Id": asked.public_id, "X-Priority-Class": cls}
    if rule is None:
        return headers
    headers["X-Priority-Downgraded"] = f"{asked.declared}; rule={rule}"
    if not asked.downgrade_recorded:
        asked.downgrade_recorded = True
        asked.d.downgrades.record(
            tenant_id=asked.caller.tenant_id,
            request_id=asked.public_id,
            from_class=asked.declared,
            to_class=cls,
            rule=rule,
        )
        metrics.DOWNGRADES.labels(rule).inc()
    return headers


class _HoldArgs(TypedDict):
    """What `charging.hold` and `charging.hold_early` are asked."""

    tenant: str
    request_id: str
    cls: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    priced_at: datetime | None
    hold_cap: Decimal | None
    spender: charging.Spender


async def admit(asked: Asked, *, early: bool) -> Admitted:
    """Hold → fall back → admit; a refusal raised after the hold has released it. ``early``: the
    hold may be booked while the request goes on."""
    d, caller, payload = asked.d, asked.caller, asked.payload
    expected_output_tokens = output_tokens_held(payload)
    hold_args = _HoldArgs(
        tenant=caller.tenant,
        request_id=asked.engine_id,
        cls=asked.cls,
        model=payload.model,
        prompt_tokens=payload.prompt_bound,
        max_output_tokens=expected_output_tokens,
        priced_at=asked.priced_at,
        hold_cap=asked.hold_cap,
        spender=charging.Spender(caller.key_prefix, asked.job or asked.batch_id or "", caller.key_creator),
    )
    held: charging.Hold | charging.EarlyHold | None = charging.hold_early(**hold_args) if early else None
    if held is None:
        held = await charging.hold(**hold_args)  # a 402 here holds nothing
    bill = Bill(held)
    cls, rule = asked.cls, asked.rule
    if isinstance(held, charging.Hold) and held.fallback:
        cls, rule = held.cls, charging.BUDGET_RULE
    now_ms = d.now_ms()
    request = Request(
        id=asked.engine_id,
        tenant=caller.tenant,
        cls=cls,
        model=payload.model,
        prompt_tokens=payload.prompt_tokens,
        expected_output_tokens=expected_output_tokens,
        enqueued_ms=now_ms,
        deadline_ms=None if asked.timeout_ms is None else now_ms + asked.timeout_ms,
        vip=caller.vip,
        job=job_of(tagged=asked.job, key_prefix=caller.key_prefix, cls=cls),
    )
    headers = _headers(asked, cls, rule)
    try:
        entry = await d.admit(request, public_id=asked.public_id, declared_class=asked.declared, rule=rule)
    except GatewayError as refused:
        bill.end(refused.code, served=False)
        refused.headers.update(headers)
        raise
    except BaseException:  # the client left while the shared scheduler answered (gateway.shared)
        bill.end(Outcome.CANCELLED, served=False)
        raise
    return Admitted(d, entry, bill, headers)
