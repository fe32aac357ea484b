"""What a class's price change touches, as the ledger sees it (scheduling.prices shows it before a
change of more than 2x is confirmed): the class's open holds and what it was charged in 24 hours."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Exists, OuterRef, Sum

from billing.models import LedgerEntry
from billing.money import MICRO

Kind = LedgerEntry.Kind
DAY = timedelta(days=1)
OPEN_HOLDS_SINCE = timedelta(days=2)  # a hold lives at most a batch window (24 h), and a sweep ends it


def class_exposure(class_name: str, now: datetime) -> dict[str, object]:
    """The class's holds not ended (waiting or running requests) and its charges of the last day."""
    ended = LedgerEntry.objects.filter(kind=Kind.RELEASE, request_id=OuterRef("request_id"))
    open_holds = (
        LedgerEntry.objects.filter(kind=Kind.HOLD, class_name=class_name, at__gte=now - OPEN_HOLDS_SINCE)
        .exclude(Exists(ended))
        .count()
    )
    spent = LedgerEntry.objects.filter(kind=Kind.CHARGE, class_name=class_name, at__gte=now - DAY, at__lte=now)
    day_spend = Decimal(spent.aggregate(total=Sum("amount"))["total"] or 0).quantize(MICRO)  # SQLite sums floats
    return {"open_holds": open_holds, "day_spend": day_spend}
