"""The one check of a price change, used by every door that sets prices: the console, YAML load
(`scheduler_config load`), the Django admin and `manage.py backend create`.

A class's factor lies within FAIRGATE_FACTOR_MIN..FAIRGATE_FACTOR_MAX with at most 4 decimal
places and never takes effect in the past; a backend's prices are >= 0 with at most 6 places. A
factor moved more than `MAX_STEP` times up or down is refused unless confirmed, and the refusal
says what it touches (`PriceImpact`). The layers above report that through `impact_source_add`
(billing: open holds and a day's spend; batches: open batches), so this module imports neither.
The price versions themselves are billing's: this app reads and writes them through the
`PriceBook` billing registers at start-up (`price_book_set`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

if TYPE_CHECKING:
    from scheduling.models import PriorityClass

MAX_STEP = Decimal(2)
FACTOR_PLACES = Decimal("0.0001")
BACKEND_PRICE_PLACES = Decimal("0.000001")
PAST_SLACK = timedelta(seconds=1)  # "now" in a form reaches the server a moment later
ZERO = Decimal(0)


class PriceRefused(ValidationError):
    """A price refused; its messages say why."""


@dataclass(frozen=True)
class PriceImpact:
    """What a class's factor change touches, as the refusal asking for confirmation shows it."""

    class_name: str
    old_factor: Decimal
    new_factor: Decimal
    open_holds: int = 0  # requests of the class admitted and not ended (the ledger's open holds)
    open_batches: int = 0  # batches of the class still running (charged at their creation's prices)
    day_spend: Decimal = ZERO  # charged to the class in the last 24 h

    @property
    def day_spend_new(self) -> Decimal:
        if self.old_factor <= 0:
            return self.day_spend
        return (self.day_spend * self.new_factor / self.old_factor).quantize(BACKEND_PRICE_PLACES)

    def __str__(self) -> str:
        currency = settings.FAIRGATE_CURRENCY
        return (
            f"{self.class_name} ×{_text(self.old_factor)} → ×{_text(self.new_factor)} ({_step(self)}) touches "
            f"{self.open_holds} requests waiting or running, {self.open_batches} open batches (they keep the "
            f"prices of their creation), a day's spend {self.day_spend} → {self.day_spend_new} {currency}"
        )


class ConfirmNeeded(PriceRefused):
    """A change of more than MAX_STEP× that was not confirmed: ``impacts`` say what it touches."""

    def __init__(self, impacts: Sequence[PriceImpact]) -> None:
        self.impacts = list(impacts)
        text = "; ".join(str(impact) for impact in self.impacts)
        super().__init__(f"{text}. It moves a price more than {_text(MAX_STEP)}×: confirm to apply it.")


class PriceBook(Protocol):
    """Where the classes' price factors are kept (billing's price versions)."""

    def factors_at(self, at: datetime) -> dict[str, Decimal]:
        """Every class's factor in force at ``at`` (a class without a version is absent)."""
        ...

    def factor_at(self, class_name: str, at: datetime) -> Decimal | None:
        """The class's factor in force at ``at`` (None: no version yet, a new class)."""
        ...

    def version_add(self, priority_class: PriorityClass, price_factor: Decimal, actor: str) -> None:
        """A new version of the class's factor, in force now, audited."""
        ...


_price_book: list[PriceBook] = []


def price_book_set(book: PriceBook) -> None:
    """Called by billing's ``ready()``: the price versions this app reads and writes."""
    _price_book[:] = [book]


def price_book() -> PriceBook:
    if not _price_book:
        raise RuntimeError("no price book: billing's AppConfig.ready() registers it (is billing installed?)")
    return _price_book[0]


ImpactSource = Callable[[str, datetime], dict[str, Any]]  # (class name, now) -> some PriceImpact fields
_sources: list[ImpactSource] = []


def impact_source_add(source: ImpactSource) -> None:
    """Called by an app's ``ready()``: ``source`` reports some of PriceImpact's counts."""
    if source not in _sources:
        _sources.append(source)


def price_impact(*, class_name: str, old_factor: Decimal, new_factor: Decimal, now: datetime) -> PriceImpact:
    impact = PriceImpact(class_name, old_factor, new_factor)
    for source in _sources:
        impact = replace(impact, **source(class_name, now))
    return impact


def _text(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _step(impact: PriceImpact) -> str:
    if impact.old_factor <= 0:
        return "from zero"
    ratio = impact.new_factor / impact.old_factor
    if ratio >= 1:
        return f"{ratio.quantize(Decimal('0.01'))}× up"
    return f"{(1 / ratio).quantize(Decimal('0.01'))}× down"


def _decimal(raw: object, *, what: str) -> Decimal:
    try:
        value = Decimal(str(raw).strip())
    except InvalidOperation:
        raise PriceRefused(f"{what}: {raw!r} is not a number") from None
    if not value.is_finite():
        raise PriceRefused(f"{what}: {raw!r} is not a number")
    return value


def moves_far(old: Decimal, new: Decimal) -> bool:
    if old <= 0:
        return new != old
    return new > old * MAX_STEP or new * MAX_STEP < old


def price_factor_check(
    *,
    class_name: str,
    price_factor: object,
    effective_at: datetime | None = None,
    confirm: bool = False,
    now: datetime | None = None,
) -> Decimal:
    """THE check of a class's new price factor, for every door; returns the factor. Raises
    PriceRefused (out of range, more than 4 places, back-dated) or ConfirmNeeded (more than
    MAX_STEP× from the factor in force then, not confirmed)."""
    now = now or timezone.now()
    factor = _decimal(price_factor, what="price factor")
    low, high = settings.FAIRGATE_FACTOR_MIN, settings.FAIRGATE_FACTOR_MAX
    if not low <= factor <= high:
        raise PriceRefused(
            f"price factor {_text(factor)} of {class_name} is outside the allowed range {_text(low)}–{_text(high)} "
            "(FAIRGATE_FACTOR_MIN, FAIRGATE_FACTOR_MAX)"
        )
    if factor != factor.quantize(FACTOR_PLACES):
        raise PriceRefused(f"price factor {factor} has more than 4 decimal places")
    if effective_at is not None and effective_at < now - PAST_SLACK:
        raise PriceRefused(
            f"a price change cannot take effect in the past ({effective_at.isoformat()} is before now): "
            "a new version takes effect now or later"
        )
    old = price_book().factor_at(class_name, max(effective_at or now, now))
    if old is not None and not confirm and moves_far(old, factor):
        raise ConfirmNeeded([price_impact(class_name=class_name, old_factor=old, new_factor=factor, now=now)])
    return factor


def factors_check(changes: Sequence[tuple[str, Decimal]], *, confirm: bool) -> None:
    """`price_factor_check` of several classes' new factors at once (a YAML file): the moves that
    need confirming are refused together, each with what it touches."""
    unconfirmed: list[PriceImpact] = []
    for class_name, factor in changes:
        try:
            price_factor_check(class_name=class_name, price_factor=factor, confirm=confirm)
        except ConfirmNeeded as asked:
            unconfirmed += asked.impacts
    if unconfirmed:
        raise ConfirmNeeded(unconfirmed)


def backend_prices_check(*, name: str, input_price_per_1k: object, output_price_per_1k: object) -> None:
    """THE check of a backend's prices per 1k tokens: numbers >= 0 with at most 6 places."""
    for what, raw in (("input_price_per_1k", input_price_per_1k), ("output_price_per_1k", output_price_per_1k)):
        value = _decimal(raw, what=f"backend {name} {what}")
        if value < 0:
            raise PriceRefused(f"backend {name} {what} must be >= 0, got {_text(value)}")
        if value != value.quantize(BACKEND_PRICE_PLACES):
            raise PriceRefused(f"backend {name} {what} {value} has more than 6 decimal places")
