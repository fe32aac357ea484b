"""The billing seam of the request path: hold, settle, release.

The gateway calls these at fixed points; the billing issue fills them in (budget holds on the
ledger, `402 budget_exhausted` raised from `hold`). Today they do nothing, so every caller can
already rely on the calling convention:

* ``hold`` before admission, with the estimate; it may raise ``GatewayError(402, ...)``;
* ``settle`` once, when the upstream finished, with the actual usage (for a stream the client
  abandoned: the tokens sent so far, ``partial=True``);
* ``release`` once, when the request ends without a charge (refused, queue timeout, cancelled
  while waiting, upstream failure).

Exactly one of ``settle``/``release`` follows every ``hold`` that returned; the gateway runs
them shielded from cancellation, so a client disconnect never leaks a hold.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    """What was held for one request (billing adds its ledger reference)."""

    tenant: str
    request_id: str
    cls: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    reference: str | None = None


async def hold(*, tenant: str, request_id: str, cls: str, model: str, prompt_tokens: int,
               max_output_tokens: int) -> Hold:
    return Hold(tenant, request_id, cls, model, prompt_tokens, max_output_tokens)


async def settle(held: Hold, *, backend: str, prompt_tokens: int, output_tokens: int,
                 partial: bool = False) -> None:
    return None


async def release(held: Hold, *, reason: str) -> None:
    return None
