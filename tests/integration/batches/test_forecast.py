"""The forecast said at a batch's create (batches.forecast): each line priced exactly as its hold
will book it, a 402 when the budget cannot hold even the cheapest line, and whether the batch's
work can be done within its window."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from batches.files import FileRefused
from batches.forecast import Pool, forecast
from batches.lines import lines_parse
from billing.services import budget_hold
from gateway.errors import ErrorCode
from gateway.limits import prompt_bound
from tenants.models import Tenant
from tests.integration.batches.test_claims import _batch
from tests.integration.billing.conftest import make_world
from tests.integration.billing.helpers import year_budget

pytestmark = pytest.mark.django_db
DAY = timedelta(hours=24)


@pytest.fixture
def world():
    return make_world()


def _lines(count: int, *, words: int = 20, max_tokens: int = 64):
    raw = b"".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "m",
                    "messages": [{"role": "user", "content": " ".join(["word"] * (words + i))}],
                    "max_tokens": max_tokens,
                },
            }
        ).encode()
        + b"\n"
        for i in range(count)
    )
    return lines_parse([raw], endpoint="/v1/chat/completions", served={"m": False})


def _said(lines, *, slots: int = 4, service_ms: float = 1000.0, tenant: str = "alpha"):
    now = timezone.now()
    pool = Pool(backends=((frozenset({"m"}), slots),), service_ms=service_ms)
    return forecast(
        tenant_slug=tenant,
        class_name="BATCH",
        lines=[line.terms for line in lines],
        pool=pool,
        created_at=now,
        expires_at=now + DAY,
    )


def _held(line, tenant: str, request_id: str) -> Decimal:
    """What booking ``line``'s hold for ``tenant`` holds."""
    return budget_hold(
        tenant_slug=tenant,
        request_id=request_id,
        class_name="BATCH",
        model="m",
        prompt_tokens=prompt_bound(line.payload),
        max_output_tokens=line.payload.output_limit,
    ).amount


def test_the_cost_bound_is_the_sum_of_the_holds_the_lines_will_book(world):
    lines = _lines(5)
    said = _said(lines)
    held = [_held(line, "alpha", f"h{line.number}") for line in lines]
    assert Decimal(said["cost_bound"]) == sum(held) > 0
    assert said["budget_covers"] is True and Decimal(said["budget_remaining"]) == year_budget("alpha").remaining + sum(
        held
    )  # read before the holds above


def test_a_budget_that_cannot_hold_the_cheapest_line_refuses_the_batch_with_402(world):
    lines = _lines(3)
    cheapest = min(_held(line, "beta", f"p{line.number}") for line in lines)
    assert _said(lines)["budget_covers"] is True  # a large budget (and its rows made)
    budget = year_budget("alpha")
    Tenant.objects.filter(slug="alpha").update(annual_budget=budget.spent + budget.held + cheapest / 2)
    with pytest.raises(FileRefused) as refused:
        _said(lines)
    assert refused.value.status == 402 and refused.value.code == ErrorCode.BUDGET_EXHAUSTED
    assert "no line could run" in refused.value.message
    room_for_one = budget.spent + budget.held + cheapest  # room for exactly one line: accepted, said short
    Tenant.objects.filter(slug="alpha").update(annual_budget=room_for_one)
    said = _said(lines)
    assert said["budget_covers"] is False and Decimal(said["budget_remaining"]) == cheapest


def test_a_batch_whose_work_cannot_drain_in_its_window_is_said_not_to_fit(world):
    lines = _lines(100)
    fits = _said(lines, slots=4, service_ms=1000.0)
    assert fits["fits_window"] is True and fits["done_in_s"] == 25 and fits["lines_ahead"] == 0
    slow = _said(lines, slots=1, service_ms=DAY.total_seconds() * 1000 / 50)  # 50 lines a day on one slot
    assert slow["fits_window"] is False and slow["done_in_s"] == 2 * DAY.total_seconds()
    _batch(world["alpha"], 300)  # another batch's 300 lines run before it
    behind = _said(lines, slots=4, service_ms=1000.0)
    assert behind["lines_ahead"] == 300 and behind["done_in_s"] == 100
    assert _said(lines, slots=0)["fits_window"] is False  # no slot serves its model


def test_a_backend_price_raised_after_the_create_takes_no_line_past_its_part_of_the_bound(world):
    from types import SimpleNamespace

    from batches.prices import line_hold_cap
    from billing.pricing import backend_prices
    from scheduling.models import Backend

    lines = _lines(4)
    said = _said(lines)
    batch = SimpleNamespace(forecast=said)
    caps = [
        line_hold_cap(
            batch,
            model="m",
            prompt_tokens=prompt_bound(line.payload),
            output_tokens=line.payload.output_limit,
        )
        for line in lines
    ]
    assert sum(caps) == Decimal(said["cost_bound"])  # each line's part, priced as the bound was
    Backend.objects.filter(name="gpu-a").update(input_price_per_1k=Decimal(100), output_price_per_1k=Decimal(200))
    backend_prices(backend_name="gpu-a", refresh=True)  # the new prices, as a booking would read them now
    held = [
        budget_hold(
            tenant_slug="alpha",
            request_id=f"after-{line.number}",
            class_name="BATCH",
            model="m",
            prompt_tokens=prompt_bound(line.payload),
            max_output_tokens=line.payload.output_limit,
            hold_cap=cap,
        ).amount
        for line, cap in zip(lines, caps)
    ]
    assert held == caps  # priced 100x now, held at the bound's part
    uncapped = budget_hold(
        tenant_slug="alpha",
        request_id="http-after",
        class_name="BATCH",
        model="m",
        prompt_tokens=prompt_bound(lines[0].payload),
        max_output_tokens=lines[0].payload.output_limit,
    ).amount
    assert uncapped > 50 * caps[0]  # a request that is no batch line pays the new prices
    assert line_hold_cap(SimpleNamespace(forecast={}), model="m", prompt_tokens=1, output_tokens=1) is None
