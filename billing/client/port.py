"""The billing port: what the request path asks of billing (hold, early hold, settle, release,
forget), and the hold it gets back. `billing.client.holds` implements it; docs/money.md says
what each step guarantees."""

from __future__ import annotations

import asyncio
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple, Protocol

CANCELLED = "cancelled"  # the release reason of a hold whose caller left (gateway.lifecycle.Outcome's)


class Hold(NamedTuple):
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


class Spender(NamedTuple):
    """Who spends, as every ledger entry of the request records it: the API key's public prefix,
    the job (``X-Job-Id``, or a batch line's batch id) and the key's creator (its username)."""

    key_prefix: str = ""
    job_id: str = ""
    key_creator: str = ""


NOBODY = Spender()


class PendingHold(Protocol):
    """A hold being booked while its request goes on (billing.client.holds.EarlyHold)."""

    asked: Hold
    future: asyncio.Future

    async def booked(self) -> Hold:
        """The hold once booked; a refusal raised as billing's error."""
        ...

    def release(self, reason: str) -> None:
        """The request ended before its hold was confirmed: released once it is booked."""
        ...


class BillingPort(Protocol):
    """The request path's billing. Exactly one of ``settle``/``release``/``forget`` follows every
    hold that was booked. Refusals: BudgetExhausted, RequestIdUsed, RequestIdInUse (billing.errors)."""

    async def hold(
        self,
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
    ) -> Hold: ...

    def hold_early(
        self,
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
    ) -> PendingHold | None: ...

    def settle(
        self, held: Hold, *, backend: str, prompt_tokens: int, output_tokens: int, partial: bool = False
    ) -> asyncio.Future | None: ...

    def release(self, held: Hold | PendingHold, *, reason: str) -> None: ...

    def forget(self, held: Hold) -> None: ...
