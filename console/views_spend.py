"""A department's charges for one month, by class, by API key and by job (read-only), for its
members and for admins (``?tenant=``); the same sums as the report API's ``spend/``."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing.money import ZERO
from billing.periods import fiscal_tz, month_period_at
from billing.reports import spend_by
from console import access
from console.access import role_required
from console.views import QUEUE_ROLES, _tenant_or_403
from tenants.models import Tenant

MONTH_RE = re.compile(r"(\d{4})-(\d{2})")
SUMMED = ("requests", "prompt_tokens", "completion_tokens", "charge")


def _month(raw: str | None) -> datetime:
    """The first instant of the asked month (YYYY-MM) in the fiscal time zone; now's by default."""
    if not raw:
        return timezone.now()
    match = MONTH_RE.fullmatch(raw)
    if match is None or not 1 <= int(match.group(2)) <= 12:
        raise Http404(f"No month '{raw[:16]}': use YYYY-MM.")
    return datetime(int(match.group(1)), int(match.group(2)), 1, tzinfo=fiscal_tz())


def _by_class(key_rows: list[dict]) -> list[dict]:
    """The key rows (class × key) summed by class."""
    classes: dict[str, dict] = {}
    for row in key_rows:
        into = classes.setdefault(row["class"], {"class": row["class"], **dict.fromkeys(SUMMED, 0), "charge": ZERO})
        for field in SUMMED:
            into[field] += row[field]
    return sorted(classes.values(), key=lambda r: r["charge"], reverse=True)


def _shift(month: datetime, months: int) -> str:
    index = month.year * 12 + month.month - 1 + months
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


@role_required(*QUEUE_ROLES)
def spend_page(request: HttpRequest) -> HttpResponse:
    tenant = _tenant_or_403(request)
    period = month_period_at(_month(request.GET.get("month")))
    scope = Tenant.objects.filter(pk=tenant.pk)
    since, until = period.starts_at, period.ends_at
    by_key = spend_by(tenants=scope, group_by="key", since=since, until=until)
    by_job = spend_by(tenants=scope, group_by="job", since=since, until=until)
    total: Decimal = sum((row["charge"] for row in by_key), ZERO)
    start = period.starts_at
    context = {
        "tenant": tenant,
        "month": f"{start:%Y-%m}",
        "month_name": f"{start:%B %Y}",
        "previous": _shift(start, -1),
        "next": _shift(start, 1) if period.ends_at <= timezone.now() else None,
        "by_class": _by_class(by_key),
        "by_key": by_key,
        "by_job": sorted(by_job, key=lambda r: r["charge"], reverse=True),
        "total": total,
        "currency": settings.FAIRGATE_CURRENCY,
        "tenant_query": f"&tenant={tenant.slug}" if access.is_admin(request.user) else "",
        "since": f"{start:%Y-%m-%d}",
        "until": f"{period.ends_at:%Y-%m-%d}",
    }
    return render(request, "console/spend.html", context)
