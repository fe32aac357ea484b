"""A hold asked with ``priced_at`` (a batch line: its batch's creation) is priced, so charged, at
the version in force then, not at the one in force when it is booked; without it, at ``at``."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

from django.utils import timezone

from billing.booking import book_one
from billing.booking_asks import HoldAsk
from billing.models import PriceVersion
from billing.pricing import price_version_at
from scheduling.models import PriorityClass
from tests.integration.billing.helpers import settle


def _hold(request_id: str, *, priced_at=None):
    return book_one(
        HoldAsk(
            request_id=request_id,
            tenant_slug="alpha",
            class_name="BATCH",
            model="m",
            prompt_tokens=1000,
            max_output_tokens=500,
            at=timezone.now(),
            priced_at=priced_at,
        )
    )


def test_a_batch_line_is_held_and_charged_at_its_batch_creations_price(world):
    created = timezone.now() - timedelta(minutes=1)
    old = price_version_at(class_name="BATCH", at=created)
    PriceVersion.objects.create(  # 100x, past the doors' range check, in force since after the batch's creation
        priority_class=PriorityClass.objects.get(name="BATCH"),
        price_factor=D("70"),
        effective_at=created + timedelta(seconds=1),
    )
    line = _hold("alpha/batch_1.1", priced_at=created)
    assert (line.factor, line.price_version_id, line.amount) == (D("0.7"), old.pk, D("1.4"))  # base 2 × 0.7
    assert settle("alpha/batch_1.1") == D("0.49")  # 0.7 base on gpu-b × 0.7
    request = _hold("alpha/http-1")
    assert (request.factor, request.amount) == (D("70"), D("140"))
