"""What a request costs: base cost from backend prices per 1k tokens, times the class's factor.

Amounts keep 6 decimal places (ROUND_HALF_UP); the unrounded base cost is multiplied before the
charge is rounded, so a charge never carries two roundings.

Prices and backends are read through billing.cache. A class's whole version history is cached
and the version is picked by the admission time `at`, so a change scheduled for later applies
from its effective time; a change that takes effect now is seen at once in this process, and
booking re-reads the versions of a batch's classes under its lock for changes made elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import DatabaseError

from billing.cache import TtlCache
from billing.errors import UnknownBackend, UnknownClass, UnknownModel
from billing.models import PriceVersion
from billing.money import money
from scheduling.models import Backend

THOUSAND = Decimal(1000)


@dataclass(frozen=True)
class UnitPrices:
    input_per_1k: Decimal
    output_per_1k: Decimal

    def base_cost(self, *, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """Unrounded base cost."""
        return (self.input_per_1k * prompt_tokens + self.output_per_1k * completion_tokens) / THOUSAND


@dataclass(frozen=True)
class PriceInForce:
    """One price version of a class (PriceVersion's fields that billing needs)."""

    pk: int
    class_id: int
    price_factor: Decimal
    effective_at: datetime


@dataclass(frozen=True)
class BackendPrices:
    name: str
    enabled: bool
    model_names: tuple[str, ...]
    prices: UnitPrices


_versions: TtlCache[tuple[PriceInForce, ...]] = TtlCache()
_backends: TtlCache[dict[str, BackendPrices]] = TtlCache()


def charge_of(*, base_cost: Decimal, factor: Decimal) -> Decimal:
    return money(base_cost * factor)


def capped(priced: Decimal, ceiling: Decimal | None) -> tuple[Decimal, Decimal]:
    """(charged, unbilled) of a settlement priced ``priced``: never more than ``ceiling`` (its
    hold, or what the budget has left; None: no ceiling), the rest unbilled."""
    charged = priced if ceiling is None else min(priced, ceiling)
    return charged, priced - charged


def _load_versions(class_name: str) -> tuple[PriceInForce, ...]:
    rows = (
        PriceVersion.objects.filter(priority_class__name=class_name)
        .order_by("-effective_at", "-pk")
        .values_list("pk", "priority_class_id", "price_factor", "effective_at")
    )
    return tuple(PriceInForce(*row) for row in rows)


def price_version_at(*, class_name: str, at: datetime, refresh: bool = False) -> PriceInForce:
    """The version in force at `at`: the latest effective at or before it (ties: the newest row)."""
    versions = _versions.get(class_name, lambda: _load_versions(class_name), refresh=refresh)
    for version in versions:  # newest first
        if version.effective_at <= at:
            return version
    if not refresh:  # perhaps created since the cache was filled
        return price_version_at(class_name=class_name, at=at, refresh=True)
    raise UnknownClass(f"class {class_name!r} has no price in force at {at.isoformat()}")


def _load_backends() -> dict[str, BackendPrices]:
    rows = Backend.objects.values_list("name", "enabled", "model_names", "input_price_per_1k", "output_price_per_1k")
    return {
        name: BackendPrices(name, enabled, tuple(models or ()), UnitPrices(inp, out))
        for name, enabled, models, inp, out in rows
    }


def _all_backends(refresh: bool) -> dict[str, BackendPrices]:
    return _backends.get("all", _load_backends, refresh=refresh)


def backends_cached() -> dict[str, BackendPrices] | None:
    """The backends as cached now (loaded if the entry aged out); None if they cannot be read."""
    try:
        return _all_backends(False)
    except DatabaseError:  # the database out: the caller asks again later
        return None


def backend_prices(*, backend_name: str, refresh: bool = False) -> UnitPrices:
    found = _all_backends(refresh).get(backend_name)
    if found is not None:
        return found.prices
    if not refresh:
        return backend_prices(backend_name=backend_name, refresh=True)
    raise UnknownBackend(f"no backend named {backend_name!r}")


def model_unit_prices(*, model: str) -> list[UnitPrices]:
    """The prices of every enabled backend serving ``model`` (a batch keeps them from its creation)."""
    return [b.prices for b in _all_backends(False).values() if b.enabled and model in b.model_names]


def upper_bound_base_cost(*, model: str, prompt_tokens: int, completion_tokens: int, refresh: bool = False) -> Decimal:
    """The base cost on the most expensive enabled backend serving `model` (dispatch picks one later)."""
    costs = [
        b.prices.base_cost(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        for b in _all_backends(refresh).values()
        if b.enabled and model in b.model_names
    ]
    if costs:
        return max(costs)
    if not refresh:
        return upper_bound_base_cost(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, refresh=True
        )
    raise UnknownModel(f"no enabled backend serves model {model!r}")
