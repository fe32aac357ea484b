"""The gateway's use of billing's port (billing.client): the same calls, with billing's refusals
turned into the answers a client gets (402 budget_exhausted, 400 for an X-Request-Id already
used). The booking itself, group commit and the billing worker, are billing.client's.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from billing.client import (
    BudgetExhausted,
    Charged,
    EarlyHold,
    Hold,
    RequestIdInUse,
    RequestIdUsed,
    Spender,
    UnitPrices,
    forget,
    hold_early,
    release,
    release_leftover_holds,
    settle,
    start,
    stop,
)
from billing.client import hold as billing_hold
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.lifecycle import public_id_of

BUDGET_RULE = "budget"  # the downgrade rule a budget fallback shows

__all__ = [
    "BUDGET_RULE",
    "Charged",
    "EarlyHold",
    "EarlyHoldRefused",
    "Hold",
    "Spender",
    "UnitPrices",
    "booked",
    "forget",
    "hold",
    "hold_early",
    "release",
    "release_leftover_holds",
    "settle",
    "start",
    "stop",
]


class EarlyHoldRefused(Exception):
    """An early hold was refused for the budget: admit the request again, hold first."""


def _refusal(refused: BudgetExhausted | RequestIdUsed | RequestIdInUse, request_id: str) -> GatewayError:
    if isinstance(refused, BudgetExhausted):
        return GatewayError(
            402, ErrorCode.BUDGET_EXHAUSTED, f"{refused} Ask finance to raise it, or use a cheaper class."
        )
    why = (
        "was used by an earlier request that was served; send a new one"
        if isinstance(refused, RequestIdUsed)
        else "is already in use by one of your live requests"
    )
    return invalid_request(f"X-Request-Id '{public_id_of(request_id)}' {why}.")


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
    spender: Spender | None = None,
) -> Hold:
    """billing's hold; refused: the GatewayError the client gets (402, or 400 for its id)."""
    try:
        return await billing_hold(
            tenant=tenant,
            request_id=request_id,
            cls=cls,
            model=model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max_output_tokens,
            priced_at=priced_at,
            hold_cap=hold_cap,
            spender=spender or Spender(),
        )
    except (BudgetExhausted, RequestIdUsed, RequestIdInUse) as refused:
        raise _refusal(refused, request_id) from None


async def booked(early: EarlyHold) -> Hold:
    """An early hold, once booked; refused: the GatewayError the client gets."""
    try:
        return await early.booked()
    except (BudgetExhausted, RequestIdUsed, RequestIdInUse) as refused:
        raise _refusal(refused, early.asked.request_id) from None
