"""The billing seam of the request path: hold, settle, release (billing.services underneath).

* ``hold`` before admission, with the estimate; raises ``GatewayError(402 budget_exhausted)``
  unless the tenant is configured to fall back to a cheaper class that fits (then the returned
  hold names that class, and the gateway shows ``rule=budget``);
* ``settle`` once, when the upstream finished, with the actual usage (for a stream the client
  abandoned: the tokens sent so far, ``partial=True``); returns the charge;
* ``release`` once, when the request ends without a charge (refused, queue timeout, cancelled
  while waiting, upstream failure).

Exactly one of ``settle``/``release`` follows every ``hold`` that returned; the gateway runs
them shielded from cancellation, so a client disconnect never leaks a hold. Each is one short
transaction in a worker thread. On PostgreSQL billing calls run in the thread pool, so holds of
different requests overlap their round trips; SQLite has one writer, where parallel writers only
wait on its lock, so there they queue on one thread. ``FAIRGATE_BILLING=0`` turns the seam
into no-ops (used by the benchmark that measures billing's cost).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from decimal import Decimal

from django.conf import settings

from billing.errors import BillingError, BudgetExhausted
from billing.selectors import budget_fallback_class
from billing.services import budget_hold, charge_settle, hold_release
from gateway.db import db_call
from gateway.errors import GatewayError

log = logging.getLogger(__name__)
BUDGET_RULE = "budget"


def _parallel() -> bool:
    return not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")


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


def _budget_error(exc: BudgetExhausted) -> GatewayError:
    return GatewayError(402, "budget_exhausted", f"{exc} Ask finance to raise it, or use a cheaper class.")


def _hold_sync(held: Hold) -> Hold:
    args = dict(tenant_slug=held.tenant, model=held.model, prompt_tokens=held.prompt_tokens,
                max_output_tokens=held.max_output_tokens)
    try:
        result = budget_hold(request_id=held.request_id, class_name=held.cls, **args)
        return replace(held, amount=result.amount)
    except BudgetExhausted as exhausted:
        cheaper = budget_fallback_class(class_name=held.cls, **args)
        if cheaper is None:
            raise _budget_error(exhausted) from None
    try:
        result = budget_hold(request_id=held.request_id, class_name=cheaper, **args)
    except BudgetExhausted as exhausted:
        raise _budget_error(exhausted) from None
    return replace(held, cls=cheaper, amount=result.amount, fallback=True)


async def hold(*, tenant: str, request_id: str, cls: str, model: str, prompt_tokens: int,
               max_output_tokens: int) -> Hold:
    held = Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)
    if not settings.FAIRGATE_BILLING:
        return held
    return await db_call(_hold_sync, parallel=_parallel())(held)


async def settle(held: Hold, *, backend: str, prompt_tokens: int, output_tokens: int,
                 partial: bool = False) -> Decimal | None:
    if not settings.FAIRGATE_BILLING:
        return None
    try:
        return await db_call(charge_settle, parallel=_parallel())(
            request_id=held.request_id, backend_name=backend, prompt_tokens=prompt_tokens,
            completion_tokens=output_tokens)
    except BillingError:
        log.exception("could not settle %s (partial=%s); the stale-hold sweep will release it",
                      held.request_id, partial)
        return None


async def release(held: Hold, *, reason: str) -> None:
    if not settings.FAIRGATE_BILLING:
        return
    await db_call(hold_release, parallel=_parallel())(request_id=held.request_id, reason=reason)
