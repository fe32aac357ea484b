"""What a batch can expect, said when it is created: whether its budget can hold any of its lines
(if not, the create is refused with 402), what it can cost at most (the sum of its lines' holds),
and whether it can finish within its completion window (the work still to do at the class's mean
service time on the slots outside the top class's reserve: the earliest it can be done).
How the forecast reads: docs/batches.md, "Creating a batch".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings

from batches.files import FileRefused
from batches.lines import Terms
from batches.models import Batch, BatchLine
from billing.client import UnknownModel, charge_of, hold_terms, model_unit_prices, upper_bound_base_cost


@dataclass(frozen=True)
class Pool:
    """What the lines run on, as the dispatcher sees it when the batch is created."""

    backends: tuple[tuple[frozenset[str], int], ...]  # each enabled backend: its models, its slots outside the reserve
    service_ms: float  # the batch's class's mean service time

    def slots_for(self, models: set[str]) -> int:
        return sum(slots for served, slots in self.backends if served & models)


def _holds(lines: Sequence[Terms]) -> list[Decimal]:
    """Each line's base cost at its hold (before the class's factor); lines alike cost alike."""
    costs: dict[tuple[str, int, int], Decimal] = {}
    for line in lines:
        terms = (line.model, line.prompt_bound, line.output_tokens)
        if terms in costs:
            continue
        try:
            costs[terms] = upper_bound_base_cost(
                model=line.model, prompt_tokens=line.prompt_bound, completion_tokens=line.output_tokens
            )
        except UnknownModel:
            raise FileRefused(400, f"Line {line.number}: no enabled backend serves model '{line.model}'.") from None
    return [costs[(line.model, line.prompt_bound, line.output_tokens)] for line in lines]


def _money(tenant_slug: str, class_name: str, lines: Sequence[Terms], at: datetime) -> dict:
    """The batch's cost bound and its budget's room; FileRefused(402) if no line could be held."""
    bases = _holds(lines)
    remaining, factor, cheapest = hold_terms(tenant_slug=tenant_slug, class_name=class_name, at=at)
    least = charge_of(base_cost=min(bases), factor=cheapest)
    if remaining is not None and least > remaining:
        raise FileRefused(
            402,
            f"The budget has {remaining} left, and the cheapest line of this batch holds {least}: no line could run.",
        )
    bound = sum((charge_of(base_cost=base, factor=factor) for base in bases), Decimal(0))
    return {
        "cost_bound": str(bound),
        "priced": _priced(lines, factor),
        "budget_remaining": None if remaining is None else str(remaining),
        "budget_covers": remaining is None or bound <= remaining,
    }


def _priced(lines: Sequence[Terms], factor: Decimal) -> dict:
    """The prices the cost bound was made of (batches.prices.line_hold_cap caps each line's hold
    with them): the class's factor and, per model, every enabled backend's unit prices."""
    models = sorted({line.model for line in lines})
    return {
        "factor": str(factor),
        "prices": {
            model: [[str(p.input_per_1k), str(p.output_per_1k)] for p in model_unit_prices(model=model)]
            for model in models
        },
    }


def _time(lines: Sequence[Terms], pool: Pool, created_at: datetime, expires_at: datetime) -> dict:
    ahead = BatchLine.objects.filter(batch__status=Batch.Status.IN_PROGRESS).exclude(state__in=BatchLine.ENDED).count()
    slots = pool.slots_for({line.model for line in lines})
    if slots <= 0:
        return {"lines_ahead": ahead, "slots": 0, "done_in_s": None, "fits_window": False}
    done_in_s = math.ceil((ahead + len(lines)) * pool.service_ms / slots / 1000)
    return {
        "lines_ahead": ahead,
        "slots": slots,
        "service_ms": round(pool.service_ms),
        "done_in_s": done_in_s,
        "fits_window": created_at + timedelta(seconds=done_in_s) <= expires_at,
    }


def forecast(
    *, tenant_slug: str, class_name: str, lines: Sequence[Terms], pool: Pool, created_at: datetime, expires_at: datetime
) -> dict:
    """The batch's forecast (stored with it, shown in its object and the console), or
    FileRefused(402) when its budget cannot hold even its cheapest line."""
    money = _money(tenant_slug, class_name, lines, created_at) if settings.FAIRGATE_BILLING else {}
    return {**money, **_time(lines, pool, created_at, expires_at)}
