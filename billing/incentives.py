"""What the price of priority changed: per department, each class's share of requests in each
period between price changes, and the premium paid for the top class (the field report's story:
once the top class cost 1.6x, the top-class share fell from 89 % to 23 %).

A *price change* is a price version that replaced an earlier one of its class (a class's first
version prices it, it changes nothing). The changes inside [since, until) cut the time into
periods; each period's rows come from the charges booked in it. The premium of a class is what
its charges cost above the compute cost (charge - base cost): positive for a class priced above
1, negative (a discount) below.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Max, Min, QuerySet
from django.db.models.functions import Trunc

from billing.models import LedgerEntry, PriceVersion
from billing.money import ZERO, MoneySum, or_zero
from billing.periods import fiscal_tz
from scheduling.models import PriorityClass
from tenants.models import Tenant

SHARE = Decimal("0.0001")
# the share chart's bucket: days up to two months of charges, else weeks (shorter spans: finer)
SHARE_STEPS = ((timedelta(hours=3), "minute"), (timedelta(days=3), "hour"), (timedelta(days=62), "day"))
STEP = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "week": timedelta(weeks=1),
}
MAX_BUCKETS = 500


def factor_text(factor: Decimal) -> str:
    """A factor as finance writes it: 0.7, 1.2, 2 (never 0.7000 or 2E+0)."""
    return f"{factor.normalize():f}"


@dataclass(frozen=True)
class PriceChange:
    at: datetime
    class_name: str
    old: Decimal
    new: Decimal

    @property
    def label(self) -> str:
        return f"{self.class_name} {factor_text(self.old)} → {factor_text(self.new)}"


def price_changes(*, since: datetime | None = None, until: datetime | None = None) -> list[PriceChange]:
    """Every version that replaced an earlier one of its class, in time order, within the period."""
    rows = PriceVersion.objects.order_by("priority_class_id", "effective_at", "pk").values_list(
        "priority_class__name", "effective_at", "price_factor"
    )
    changes: list[PriceChange] = []
    previous: dict[str, Decimal] = {}
    for name, at, factor in rows:
        old = previous.get(name)
        previous[name] = factor
        if old is None or old == factor:
            continue
        if (since is None or at >= since) and (until is None or at < until):
            changes.append(PriceChange(at, name, old, factor))
    return sorted(changes, key=lambda c: (c.at, c.class_name))


def _periods(
    changes: list[PriceChange], since: datetime | None, until: datetime | None
) -> list[tuple[datetime | None, datetime | None, str]]:
    """[start, end, what opened it]: one period before the first change, then one per change time
    (changes at the same instant open one period together)."""
    cuts: dict[datetime, list[str]] = {}
    for change in changes:
        cuts.setdefault(change.at, []).append(change.label)
    times = sorted(cuts)
    starts: list[datetime | None] = [since, *times]
    ends: list[datetime | None] = [*times, until]
    opened = ["prices as first set" if since is None else "prices at the start", *("; ".join(cuts[t]) for t in times)]
    return list(zip(starts, ends, opened, strict=True))


def _in_period(*, tenants: QuerySet[Tenant], start: datetime | None, end: datetime | None) -> QuerySet:
    qs = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.CHARGE, tenant__in=tenants)
    qs = qs if start is None else qs.filter(at__gte=start)
    return qs if end is None else qs.filter(at__lt=end)


def top_class() -> str | None:
    return PriorityClass.objects.order_by("level", "pk").values_list("name", flat=True).first()


def class_shift(
    *, tenants: QuerySet[Tenant], since: datetime | None = None, until: datetime | None = None
) -> list[dict]:
    """Tenant x period x class: requests, share of the tenant's requests in the period, charge, base
    cost and premium (charge - base cost); ``top`` marks the top class. Periods with no charges of
    a tenant give no rows for it."""
    top = top_class()
    out = []
    changes = price_changes(since=since, until=until)
    for index, (start, end, opened) in enumerate(_periods(changes, since, until)):
        grouped = (
            _in_period(tenants=tenants, start=start, end=end)
            .values("tenant__slug", "class_name")
            .annotate(requests=Count("id"), charge=MoneySum("amount"), base_cost=MoneySum("base_cost"))
            .order_by("tenant__slug", "class_name")
        )
        rows = list(grouped)
        totals: dict[str, int] = {}
        for row in rows:
            totals[row["tenant__slug"]] = totals.get(row["tenant__slug"], 0) + row["requests"]
        for row in rows:
            charge, base = or_zero(row["charge"]), or_zero(row["base_cost"])
            out.append(
                {
                    "tenant": row["tenant__slug"],
                    "period": index,
                    "starts_at": start,
                    "ends_at": end,
                    "opened_by": opened,
                    "class": row["class_name"],
                    "top": row["class_name"] == top,
                    "requests": row["requests"],
                    "request_share": (Decimal(row["requests"]) / totals[row["tenant__slug"]]).quantize(SHARE),
                    "charge": charge,
                    "base_cost": base,
                    "premium": charge - base,
                }
            )
    return out


def top_share_by_period(rows: list[dict]) -> list[dict]:
    """Across the tenants of ``rows`` (class_shift's): per period, the top class's share of all
    requests and the premium paid for it (the whole-company line of the story)."""
    periods: dict[int, dict] = {}
    for row in rows:
        period = periods.setdefault(
            row["period"],
            {
                "period": row["period"],
                "starts_at": row["starts_at"],
                "ends_at": row["ends_at"],
                "opened_by": row["opened_by"],
                "requests": 0,
                "top_requests": 0,
                "top_premium": ZERO,
            },
        )
        period["requests"] += row["requests"]
        if row["top"]:
            period["top_requests"] += row["requests"]
            period["top_premium"] += row["premium"]
    out = []
    for period in sorted(periods.values(), key=lambda p: p["period"]):
        share = Decimal(period["top_requests"]) / period["requests"] if period["requests"] else ZERO
        out.append({**period, "top_share": share.quantize(SHARE)})
    return out


def share_series(
    *, tenants: QuerySet[Tenant], since: datetime | None = None, until: datetime | None = None
) -> tuple[str, list[dict]]:
    """(step, rows): each class's share of all the requests of ``tenants`` per time bucket, with the
    bucket's total (its volume); buckets between the first and the last with no request give
    rows of 0 requests and no share. The incentive view's chart, price changes marked on its axis."""
    charges = _in_period(tenants=tenants, start=since, end=until)
    span = charges.aggregate(first=Min("at"), last=Max("at"))
    if span["first"] is None:
        return "day", []
    step = next((s for limit, s in SHARE_STEPS if span["last"] - span["first"] <= limit), "week")
    grouped = (
        charges.annotate(bucket=Trunc("at", step, tzinfo=fiscal_tz()))
        .values("bucket", "class_name")
        .annotate(requests=Count("id"))
        .order_by("bucket", "class_name")
    )
    cells: dict[datetime, dict[str, int]] = {}
    for row in grouped:
        cells.setdefault(row["bucket"], {})[row["class_name"]] = row["requests"]
    classes = sorted({name for counts in cells.values() for name in counts})
    buckets, at = set(cells), min(cells)
    while at < max(cells) and len(buckets) < MAX_BUCKETS:  # the empty buckets between: volume fell to 0
        at += STEP[step]
        buckets.add(at)
    out = []
    for bucket in sorted(buckets):
        counts = cells.get(bucket, {})
        total = sum(counts.values())
        for name in classes:
            n = counts.get(name, 0)
            share = (Decimal(n) / total).quantize(SHARE) if total else None
            out.append({"at": bucket, "class": name, "requests": n, "bucket_requests": total, "share": share})
    return step, out
