"""How prices apply to batches: a batch's lines are held, so charged, at the price versions in
force when the batch was created (the ones its forecast's ``cost_bound`` was priced at), whatever
the factor is when a line runs. So a price change touches no open batch; the confirmation a large
change asks for (scheduling.prices) still counts them."""

from __future__ import annotations

from datetime import datetime

from batches.models import Batch

OPEN = (Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING, Batch.Status.CANCELLING)


def batch_priced_at(batch: Batch) -> datetime:
    """The time whose price versions its lines are held at."""
    return batch.created_at


def batches_open_of_class(class_name: str, now: datetime) -> dict[str, object]:
    return {"open_batches": Batch.objects.filter(priority_class=class_name, status__in=OPEN).count()}
