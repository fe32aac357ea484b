"""Finance reports, computed from the ledger (charges) and the budgets. Rows are plain dicts.

Months are fiscal-time-zone calendar months of the charge time. Every money column is a sum of
ledger amounts, so a report adds up to the ledger exactly.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Max, Min, QuerySet, Sum
from django.db.models.functions import Trunc, TruncMonth
from django.utils import timezone

from billing.incentives import factor_text
from billing.models import Budget, LedgerEntry, PriceVersion
from billing.money import ZERO, MoneySum, money, or_zero
from billing.periods import fiscal_tz, fiscal_year_of, year_period
from tenants.models import ApiKey, Tenant

SHARE = Decimal("0.0001")
ROUNDING = Decimal("0.0000005")  # half a micro-unit: the most one 6-place rounding moves an amount


def _charge_sums() -> dict:
    """What every report sums over a group of charges: requests, tokens, base cost, charge, unbilled."""
    return {
        "requests": Count("id"),
        "prompt_tokens": Sum("prompt_tokens"),
        "completion_tokens": Sum("completion_tokens"),
        "base_cost": MoneySum("base_cost"),
        "charge": MoneySum("amount"),
        "unbilled": MoneySum("unbilled"),
    }


def _charges(*, tenants: QuerySet[Tenant], since: datetime | None, until: datetime | None) -> QuerySet:
    qs = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.CHARGE, tenant__in=tenants)
    if since is not None:
        qs = qs.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lt=until)
    return qs


def _ratio(numerator: Decimal, denominator: Decimal) -> Decimal | None:
    return None if not denominator else (numerator / denominator).quantize(SHARE)


def charges_by_month(
    *, tenants: QuerySet[Tenant], since: datetime | None = None, until: datetime | None = None
) -> list[dict]:
    """Tenant × class × month × price factor in force (a month with a price change has a row for
    each factor): requests, tokens, base cost, charge, the factor (0.7, as set), the effective
    multiplier (charge / base cost) with a note saying why where it differs from the factor,
    overrun, and unbilled (what usage priced beyond the holds, not charged)."""
    rows = (
        _charges(tenants=tenants, since=since, until=until)
        .annotate(month=TruncMonth("at", tzinfo=fiscal_tz()))
        .values("tenant__slug", "class_name", "month", "factor")
        .annotate(**_charge_sums(), overrun=MoneySum("overrun"))
        .order_by("tenant__slug", "month", "class_name", "factor")
    )
    out = []
    for row in rows:
        base, charge = or_zero(row["base_cost"]), or_zero(row["charge"])
        unbilled, factor = or_zero(row["unbilled"]), row["factor"]
        effective = _ratio(charge, base)
        out.append(
            {
                "tenant": row["tenant__slug"],
                "month": f"{row['month']:%Y-%m}",
                "class": row["class_name"],
                "requests": row["requests"],
                "prompt_tokens": row["prompt_tokens"] or 0,
                "completion_tokens": row["completion_tokens"] or 0,
                "base_cost": base,
                "charge": charge,
                "price_factor": Decimal(factor_text(factor)),
                "effective_multiplier": effective,
                "effective_note": _effective_note(
                    factor=factor, effective=effective, charge=charge, base=base, unbilled=unbilled, n=row["requests"]
                ),
                "overrun": or_zero(row["overrun"]),
                "unbilled": unbilled,
            }
        )
    return out


def _effective_note(
    *, factor: Decimal, effective: Decimal | None, charge: Decimal, base: Decimal, unbilled: Decimal, n: int
) -> str | None:
    """Why charge / base cost is not the price factor (None where it is, to 4 places)."""
    if effective is None or effective == factor.quantize(SHARE):
        return None
    if unbilled > 0:
        return f"capped at the holds: {unbilled} of usage priced beyond them was not charged"
    if abs(charge - base * factor) <= n * ROUNDING * (1 + factor):
        return "each charge and base cost is rounded to 6 decimal places: on tiny amounts the ratio drifts"
    return "charges and base costs disagree beyond rounding: see the ledger"


def class_mix(*, tenants: QuerySet[Tenant], since: datetime | None = None, until: datetime | None = None) -> list[dict]:
    """Tenant × month × class: each class's share of the tenant's requests and spend that month."""
    merged: dict[tuple[str, str, str], list] = {}  # a month with a price change has a row per factor
    for row in charges_by_month(tenants=tenants, since=since, until=until):
        cell = merged.setdefault((row["tenant"], row["month"], row["class"]), [0, ZERO])
        cell[0] += row["requests"]
        cell[1] += row["charge"]
    totals: dict[tuple[str, str], list] = defaultdict(lambda: [0, ZERO])
    for (tenant, month, _), (requests, charge) in merged.items():
        totals[(tenant, month)][0] += requests
        totals[(tenant, month)][1] += charge
    out = []
    for (tenant, month, class_name), (requests, charge) in merged.items():
        requests_total, spend_total = totals[(tenant, month)]
        out.append(
            {
                "tenant": tenant,
                "month": month,
                "class": class_name,
                "requests": requests,
                "request_share": _ratio(Decimal(requests), Decimal(requests_total)),
                "charge": charge,
                "spend_share": _ratio(charge, spend_total),
            }
        )
    return out


def class_mix_overall(rows: list[dict]) -> list[dict]:
    """Month x class over every tenant of ``rows`` (class_mix's): each class's share of the whole
    set's requests and spend that month (not an average of the tenants' shares)."""
    cells: dict[tuple[str, str], list] = {}
    totals: dict[str, list] = defaultdict(lambda: [0, ZERO])
    for row in rows:
        cell = cells.setdefault((row["month"], row["class"]), [0, ZERO])
        cell[0] += row["requests"]
        cell[1] += row["charge"]
        totals[row["month"]][0] += row["requests"]
        totals[row["month"]][1] += row["charge"]
    return [
        {
            "month": month,
            "class": class_name,
            "requests": requests,
            "request_share": _ratio(Decimal(requests), Decimal(totals[month][0])),
            "charge": charge,
            "spend_share": _ratio(charge, totals[month][1]),
        }
        for (month, class_name), (requests, charge) in sorted(cells.items())
    ]


def budget_burn(
    *, tenants: QuerySet[Tenant], fiscal_year: int | None = None, now: datetime | None = None, with_overrun: bool = True
) -> list[dict]:
    """Per tenant, its fiscal-year budget: spent, held, remaining, projected spend at the current rate,
    and (``with_overrun``) what actual usage charged beyond the holds: a sum over the year's charges,
    where the rest reads only the budget rows."""
    now = now or timezone.now()
    fiscal_year = fiscal_year if fiscal_year is not None else fiscal_year_of(now)
    period = year_period(fiscal_year)
    budgets = {
        b.tenant_id: b
        for b in Budget.objects.filter(kind=Budget.Kind.YEAR, fiscal_year=fiscal_year, tenant__in=tenants)
    }
    overruns = (
        dict(
            _charges(tenants=tenants, since=None, until=None)
            .filter(budget__in=list(budgets.values()))
            .values("budget_id")
            .annotate(total=MoneySum("overrun"))
            .order_by()
            .values_list("budget_id", "total")
        )
        if with_overrun
        else {}
    )
    out = []
    for tenant in tenants.order_by("slug"):
        budget = budgets.get(tenant.pk)
        limit = budget.limit if budget else tenant.annual_budget
        spent = budget.spent if budget else ZERO
        held = budget.held if budget else ZERO
        projected = _projected(spent=spent, starts_at=period.starts_at, ends_at=period.ends_at, now=now)
        out.append(
            {
                "tenant": tenant.slug,
                "fiscal_year": fiscal_year,
                "starts_at": period.starts_at,
                "ends_at": period.ends_at,
                "limit": limit,
                "spent": spent,
                "held": held,
                "remaining": None if limit is None else limit - spent - held,
                "used_share": _ratio(spent, limit) if limit else None,
                "projected_spend": projected,
                "projected_remaining": None if limit is None else limit - projected,
                **({"overrun": or_zero(overruns.get(budget.pk)) if budget else ZERO} if with_overrun else {}),
            }
        )
    return out


SERIES_STEPS = ((timedelta(hours=2), "minute"), (timedelta(days=3), "hour"), (timedelta(days=120), "day"))


def series_step(*, first: datetime, last: datetime) -> str:
    """The bucket that gives a burn chart tens of points, not one: minutes for a couple of hours
    of charges, hours for a few days, days for a few months, else months."""
    span = last - first
    return next((step for limit, step in SERIES_STEPS if span <= limit), "month")


def spend_series(
    *, tenants: QuerySet[Tenant], since: datetime | None = None, until: datetime | None = None
) -> tuple[str, list[dict]]:
    """(step, rows): per tenant, its charges by time bucket (the step fits the span of the
    charges) and the running total over the period, for one small chart per tenant."""
    charges = _charges(tenants=tenants, since=since, until=until)
    span = charges.aggregate(first=Min("at"), last=Max("at"))
    if span["first"] is None:
        return "day", []
    step = series_step(first=span["first"], last=span["last"])
    rows = (
        charges.annotate(bucket=Trunc("at", step, tzinfo=fiscal_tz()))
        .values("tenant__slug", "bucket")
        .annotate(charge=MoneySum("amount"), requests=Count("id"))
        .order_by("tenant__slug", "bucket")
    )
    out: list[dict] = []
    running: dict[str, Decimal] = {}
    for row in rows:
        slug = row["tenant__slug"]
        running[slug] = running.get(slug, ZERO) + or_zero(row["charge"])
        out.append(
            {
                "tenant": slug,
                "at": row["bucket"],
                "requests": row["requests"],
                "charge": or_zero(row["charge"]),
                "cumulative": running[slug],
            }
        )
    return step, out


def _projected(*, spent: Decimal, starts_at: datetime, ends_at: datetime, now: datetime) -> Decimal:
    """Linear: what the year ends at if spending goes on at its average rate so far."""
    if now >= ends_at or now <= starts_at:
        return spent
    elapsed_s = Decimal((now - starts_at).total_seconds())
    total_s = Decimal((ends_at - starts_at).total_seconds())
    return money(spent * total_s / elapsed_s)


def what_if(
    *,
    tenant: Tenant,
    since: datetime,
    until: datetime,
    share: Decimal,
    from_class: str = "INTERACTIVE",
    to_class: str = "BATCH",
) -> dict:
    """What the tenant would have paid in [since, until) had `share` (0..1) of its `from_class`
    traffic been `to_class`: the moved requests keep their base cost and take the `to_class`
    factor in force when each was charged."""
    charges = _charges(tenants=Tenant.objects.filter(pk=tenant.pk), since=since, until=until)
    actual = or_zero(charges.aggregate(t=MoneySum("amount"))["t"])
    moved = charges.filter(class_name=from_class)
    moved_charge = or_zero(moved.aggregate(t=MoneySum("amount"))["t"])
    repriced = ZERO
    for start, end, factor in _factor_intervals(class_name=to_class, since=since, until=until):
        base = or_zero(moved.filter(at__gte=start, at__lt=end).aggregate(t=MoneySum("base_cost"))["t"])
        repriced += base * factor
    what_if_total = money(actual - share * moved_charge + share * repriced)
    return {
        "tenant": tenant.slug,
        "since": since,
        "until": until,
        "from_class": from_class,
        "to_class": to_class,
        "share": share,
        "actual": actual,
        "from_class_charge": moved_charge,
        "what_if": what_if_total,
        "saving": actual - what_if_total,
    }


def _factor_intervals(*, class_name: str, since: datetime, until: datetime) -> list[tuple[datetime, datetime, Decimal]]:
    """[start, end, factor] pieces of [since, until) by the class's price versions (the first
    version also covers any time before it)."""
    versions = list(
        PriceVersion.objects.filter(priority_class__name=class_name, effective_at__lt=until)
        .order_by("effective_at", "pk")
        .values_list("effective_at", "price_factor")
    )
    pieces = []
    for index, (effective_at, factor) in enumerate(versions):
        start = since if index == 0 else max(since, effective_at)
        end = versions[index + 1][0] if index + 1 < len(versions) else until
        end = min(end, until)
        if start < end:
            pieces.append((start, end, factor))
    return pieces


# Who spent (ledger columns since 0010; empty on older rows): the groups of `spend_by`.
SPEND_GROUPS: dict[str, tuple[str, ...]] = {
    "key": ("class_name", "key_prefix", "key_creator"),  # tenant × class × key
    "job": ("job_id",),  # tenant × job
    "creator": ("key_creator",),  # tenant × the console user who made the keys
}


def spend_by(
    *,
    tenants: QuerySet[Tenant],
    group_by: str,
    since: datetime | None = None,
    until: datetime | None = None,
    key_prefix: str | None = None,
    job_id: str | None = None,
) -> list[dict]:
    """The charges of [since, until) by tenant and ``group_by`` (a key of SPEND_GROUPS; narrowed
    to one key or job if given): requests, tokens, base cost, charge, unbilled, first and last
    charge. A key's row names its label; rows booked before keys were recorded have empty keys."""
    columns = SPEND_GROUPS[group_by]
    charges = _charges(tenants=tenants, since=since, until=until)
    if key_prefix is not None:
        charges = charges.filter(key_prefix=key_prefix)
    if job_id is not None:
        charges = charges.filter(job_id=job_id)
    rows = (
        charges.values("tenant__slug", *columns)
        .annotate(**_charge_sums(), first_at=Min("at"), last_at=Max("at"))
        .order_by("tenant__slug", *columns)
    )
    labels = {}
    if "key_prefix" in columns:
        labels = dict(ApiKey.objects.filter(tenant__in=tenants).values_list("prefix", "label"))
    out = []
    for row in rows:
        named = {"tenant": row["tenant__slug"]}
        for column in columns:
            named[_SPEND_NAMES.get(column, column)] = row[column]
            if column == "key_prefix":
                named["key_label"] = labels.get(row[column], "")
        out.append(
            named
            | {
                "requests": row["requests"],
                "prompt_tokens": row["prompt_tokens"] or 0,
                "completion_tokens": row["completion_tokens"] or 0,
                "base_cost": or_zero(row["base_cost"]),
                "charge": or_zero(row["charge"]),
                "unbilled": or_zero(row["unbilled"]),
                "first_at": row["first_at"],
                "last_at": row["last_at"],
            }
        )
    return out


_SPEND_NAMES = {"class_name": "class", "job_id": "job"}
