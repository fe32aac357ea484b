"""How prices apply to batches: a batch's lines are held, so charged, at the price versions in
force when the batch was created (the ones its forecast's ``cost_bound`` was priced at), whatever
the factor is when a line runs, and each line's hold at most at what the bound counted for it (the
backends' prices then: a later change of a backend's own prices does not take the batch past its
bound either). So a price change touches no open batch; the confirmation a large change asks for
(scheduling.prices) still counts them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from batches.models import Batch
from billing.client import UnitPrices, charge_of

OPEN = (Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING, Batch.Status.CANCELLING)


def batch_priced_at(batch: Batch) -> datetime:
    """The time whose price versions its lines are held at."""
    return batch.created_at


def line_hold_cap(batch: Batch, *, model: str, prompt_tokens: int, output_tokens: int) -> Decimal | None:
    """The most a line is held: its part of the batch's cost bound, priced as the bound was (None:
    a batch made before bounds kept their prices, or with billing off)."""
    priced = (batch.forecast or {}).get("priced")
    if not priced or not priced["prices"].get(model):
        return None
    units = [UnitPrices(Decimal(i), Decimal(o)) for i, o in priced["prices"][model]]
    base = max(u.base_cost(prompt_tokens=prompt_tokens, completion_tokens=output_tokens) for u in units)
    return charge_of(base_cost=base, factor=Decimal(priced["factor"]))


def batches_open_of_class(class_name: str, now: datetime) -> dict[str, object]:
    return {"open_batches": Batch.objects.filter(priority_class=class_name, status__in=OPEN).count()}
