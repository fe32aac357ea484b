"""Preparing a booking (billing.booking) outside its transaction: each ask checked and priced
from the cached prices and budget ids, each settlement or release with the hold it ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from billing.booking_asks import Ask, Booked, HoldAsk, ReleaseAsk, SettleAsk
from billing.budgets import BudgetScope, budget_scope
from billing.errors import BillingError, HoldNotFound
from billing.inflight import HeldEntry, held_get
from billing.money import ZERO
from billing.pricing import PriceInForce, backend_prices, charge_of, price_version_at, upper_bound_base_cost
from billing.selectors import fallback_classes


@dataclass
class PricedHold:
    """A hold's ask priced for one class, with the price version it used."""

    ask: HoldAsk
    held: HeldEntry
    base: Decimal
    version: PriceInForce


@dataclass
class BookingPlan:
    ask: Ask
    priced: PricedHold | None = None  # holds
    held: HeldEntry | None = None  # settlements and releases: the hold they end
    charge: Decimal = ZERO  # settlements
    base: Decimal = ZERO  # settlements
    result: object = None
    entries: list[Booked] = field(default_factory=list)

    @property
    def budget_ids(self) -> tuple[int, ...]:
        """The budget rows it moves: its hold's (as priced), or those of the hold it ends."""
        held = self.priced.held if self.priced is not None else self.held
        assert held is not None  # `_prepare` lets no end without its hold into a batch
        return held.budget_ids


def _check_tokens(first: int, second: int) -> None:
    if type(first) is int and type(second) is int and first >= 0 and second >= 0:  # (a bool's type is not int)
        return
    counts = (first, second)
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts):
        raise BillingError(f"token counts are non-negative integers, not {counts}")


def price_hold(ask: HoldAsk, class_name: str, scope: BudgetScope, *, refresh: bool = False) -> PricedHold:
    version = price_version_at(class_name=class_name, at=ask.priced_at or ask.at, refresh=refresh)
    base = upper_bound_base_cost(
        model=ask.model, prompt_tokens=ask.prompt_tokens, completion_tokens=ask.max_output_tokens, refresh=refresh
    )
    amount = charge_of(base_cost=base, factor=version.price_factor)
    held = HeldEntry(
        request_id=ask.request_id,
        tenant_id=scope.tenant_id,
        budget_id=scope.year_id,
        month_budget_id=scope.month_id,
        class_name=class_name,
        price_version_id=version.pk,
        model=ask.model,
        factor=version.price_factor,
        amount=amount if ask.hold_cap is None else min(amount, ask.hold_cap),
        owner=ask.owner,
        key_prefix=ask.key_prefix,
        job_id=ask.job_id,
        key_creator=ask.key_creator,
    )
    return PricedHold(ask, held, base, version)


def prepare(ask: Ask) -> BookingPlan:
    plan = BookingPlan(ask)
    if not ask.request_id:
        raise BillingError("a billing ask needs a request id")
    if isinstance(ask, HoldAsk):
        _check_tokens(ask.prompt_tokens, ask.max_output_tokens)
        scope = budget_scope(tenant_slug=ask.tenant_slug, at=ask.at)
        plan.priced = price_hold(ask, ask.class_name, scope)
        return plan
    if isinstance(ask, ReleaseAsk) and not ask.reason:
        raise BillingError("a release needs a reason")
    plan.held = ask.held or held_get(ask.request_id)
    if isinstance(ask, ReleaseAsk) and plan.held is None:
        plan.result = False  # refused before anything was held
    if isinstance(ask, SettleAsk):
        _check_tokens(ask.prompt_tokens, ask.completion_tokens)
        if plan.held is None:
            raise HoldNotFound(f"request {ask.request_id!r} has no hold")
        base = ask.base_cost
        if base is not None and not base >= 0:
            raise BillingError(f"a base cost is not negative, not {base}")
        if base is None:
            base = backend_prices(backend_name=ask.backend_name).base_cost(
                prompt_tokens=ask.prompt_tokens, completion_tokens=ask.completion_tokens
            )
        plan.base = base
        plan.charge = charge_of(base_cost=base, factor=plan.held.factor)
    return plan


def fallbacks_priced(ask: HoldAsk) -> list[PricedHold]:
    names = fallback_classes(tenant_slug=ask.tenant_slug, class_name=ask.class_name, at=ask.at)
    scope = budget_scope(tenant_slug=ask.tenant_slug, at=ask.at)
    return [price_hold(ask, name, scope) for name in names]
