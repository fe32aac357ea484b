"""What a request costs: base cost from backend prices per 1k tokens, times the class's factor.

Amounts keep 6 decimal places (ROUND_HALF_UP); the unrounded base cost is multiplied before the
charge is rounded, so a charge never carries two roundings.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from scheduling.models import Backend, PriceVersion

from billing.errors import UnknownBackend, UnknownClass, UnknownModel
from billing.money import money

THOUSAND = Decimal(1000)


@dataclass(frozen=True)
class UnitPrices:
    input_per_1k: Decimal
    output_per_1k: Decimal

    def base_cost(self, *, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """Unrounded base cost."""
        return (self.input_per_1k * prompt_tokens + self.output_per_1k * completion_tokens) / THOUSAND


def charge_of(*, base_cost: Decimal, factor: Decimal) -> Decimal:
    return money(base_cost * factor)


def price_version_at(*, class_name: str, at: datetime) -> PriceVersion:
    version = (
        PriceVersion.objects.filter(priority_class__name=class_name, effective_at__lte=at)
        .order_by("-effective_at", "-pk")
        .only("pk", "price_factor", "effective_at")
        .first()
    )
    if version is None:
        raise UnknownClass(f"class {class_name!r} has no price in force at {at.isoformat()}")
    return version


def backend_prices(*, backend_name: str) -> UnitPrices:
    row = Backend.objects.filter(name=backend_name).values("input_price_per_1k", "output_price_per_1k").first()
    if row is None:
        raise UnknownBackend(f"no backend named {backend_name!r}")
    return UnitPrices(row["input_price_per_1k"], row["output_price_per_1k"])


def upper_bound_base_cost(*, model: str, prompt_tokens: int, completion_tokens: int) -> Decimal:
    """The base cost on the most expensive enabled backend serving `model` (dispatch picks one later)."""
    rows = Backend.objects.filter(enabled=True).values_list("model_names", "input_price_per_1k", "output_price_per_1k")
    costs = [
        UnitPrices(inp, out).base_cost(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        for names, inp, out in rows
        if model in (names or [])
    ]
    if not costs:
        raise UnknownModel(f"no enabled backend serves model {model!r}")
    return max(costs)
