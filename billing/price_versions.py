"""The classes' price versions: the factor in force at a time, the classes annotated with it, and
the one write (`price_set`, a new version, audited).

Scheduling's configuration reads and writes factors through `scheduling.prices.PriceBook`; this
module's `PRICE_BOOK` is the one billing gives it at start-up (`BillingConfig.ready`).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from audit.services import audit_record
from billing.models import PriceVersion
from scheduling.models import PriorityClass


def classes_with_price(*, at=None, active_only: bool = True):
    """The classes, each annotated with ``price_factor``: the factor in force at ``at`` (None: no version)."""
    at = at or timezone.now()
    latest = PriceVersion.objects.filter(priority_class=OuterRef("pk"), effective_at__lte=at).order_by(
        "-effective_at", "-pk"
    )
    qs = PriorityClass.objects.annotate(price_factor=Subquery(latest.values("price_factor")[:1]))
    return qs.filter(active=True) if active_only else qs


def factor_in_force(*, class_name: str, at: datetime) -> Decimal | None:
    """The class's factor at ``at`` (None: no version yet, a new class)."""
    return (
        PriceVersion.objects.filter(priority_class__name=class_name, effective_at__lte=at)
        .order_by("-effective_at", "-pk")
        .values_list("price_factor", flat=True)
        .first()
    )


def _factor_text(factor: Decimal) -> str:
    """0.7, not 0.7000 (the column's scale), nor 1E+1."""
    return format(factor.normalize(), "f")


def price_set(*, priority_class: PriorityClass, price_factor: Decimal, actor: str, effective_at=None) -> PriceVersion:
    """A new price version for a class (never an edit of an old one), audited old → new (the old
    one: the factor in force when the new one takes effect)."""
    effective_at = effective_at or timezone.now()
    before = (
        PriceVersion.objects.filter(priority_class=priority_class, effective_at__lte=effective_at)
        .order_by("-effective_at", "-pk")
        .values_list("price_factor", flat=True)
        .first()
    )
    version = PriceVersion.objects.create(
        priority_class=priority_class,
        price_factor=price_factor,
        effective_at=effective_at,
        created_by=actor,
    )
    audit_record(
        actor=actor,
        action="price",
        entity="class",
        key=priority_class.name,
        field_name="price_factor",
        old=None if before is None else _factor_text(before),
        new=_factor_text(Decimal(price_factor)),
    )
    return version


class VersionedPrices:
    """`scheduling.prices.PriceBook` over this module's price versions."""

    def factors_at(self, at: datetime) -> dict[str, Decimal]:
        return {
            c.name: c.price_factor for c in classes_with_price(at=at, active_only=False) if c.price_factor is not None
        }

    def factor_at(self, class_name: str, at: datetime) -> Decimal | None:
        return factor_in_force(class_name=class_name, at=at)

    def version_add(self, priority_class: PriorityClass, price_factor: Decimal, actor: str) -> None:
        price_set(priority_class=priority_class, price_factor=price_factor, actor=actor)


PRICE_BOOK = VersionedPrices()
