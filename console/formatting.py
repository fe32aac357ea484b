"""How the console writes money, durations and why a request ended: one function each, with the
same rules as the browser's console/static/console/format.js (a test runs both on one table).
Money is formatted from Decimal (never a float) in ``FAIRGATE_CURRENCY``: cents, and two
significant digits only where an amount is below a cent (docs/billing-and-console.md)."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings

CENT = Decimal("0.01")
NONE_TEXT = "—"

# why a request or batch line ended without an answer, in words (the engine's outcome or error code)
ENDED_BECAUSE = {
    "completed": "completed",
    "cancelled": "the client gave up (it closed the connection before an answer)",
    "queue_timeout": "queue timeout: it waited past its deadline",
    "budget_exhausted": "budget exhausted: the department's budget could not hold it",
    "upstream_error": "upstream error: the model's server failed after retries",
    "upstream_rejected": "the model's server refused the request",
    "early_hold_refused": "its charge could not be held against the budget",
    "no_backend": "no server offered its model",
    "queue_full": "the queue was full",
    "invalid_api_key": "its API key was revoked",
    "batch_cancelled": "the batch was cancelled",
    "batch_expired": "the batch's completion window ended first",
    "worker_lost": "the workers that started it never finished it",
    "service_unavailable": "the gateway could not reach its database",
    "internal_error": "an internal error (logged)",
}


def ended_because(code: str | None) -> str:
    """``code`` (an outcome or error code) in words; an unknown one as itself."""
    if not code:
        return "unknown"
    return ENDED_BECAUSE.get(code, code.replace("_", " "))


def as_decimal(amount) -> Decimal | None:
    if amount is None or amount == "":
        return None
    if isinstance(amount, float):
        raise TypeError("money is never a float: pass a Decimal or its text")
    try:
        value = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def money_text(amount, currency: str | None = None) -> str:
    """``amount`` (Decimal or decimal text) as ``USD 1,234.50``; ``USD 0.0055`` below a cent."""
    value = as_decimal(amount)
    if value is None:
        return NONE_TEXT
    currency = currency or settings.FAIRGATE_CURRENCY
    if value != 0 and abs(value) < CENT:
        shown = value.quantize(Decimal(1).scaleb(value.adjusted() - 1), rounding=ROUND_HALF_UP)
        if abs(shown) >= CENT:
            shown = shown.quantize(CENT, rounding=ROUND_HALF_UP)
    else:
        shown = value.quantize(CENT, rounding=ROUND_HALF_UP)
    if shown == 0:
        shown = abs(shown)  # never "-0.00"
    return f"{currency} {shown:,f}"


def duration_text(ms) -> str:
    """A duration in ms as ``850 ms``, ``12.4 s``, ``2 min 5 s`` or ``1 h 20 min``; rounded once,
    so never ``60 s`` nor ``60 min``."""
    if ms is None:
        return NONE_TEXT
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms} ms"
    tenths = (ms + 50) // 100
    if tenths < 600:
        return f"{tenths // 10}.{tenths % 10} s"
    seconds = (ms + 500) // 1000
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{minutes} min" if not rest else f"{minutes} min {rest} s"
    hours, minutes = divmod((seconds + 30) // 60, 60)
    return f"{hours} h" if not minutes else f"{hours} h {minutes} min"
