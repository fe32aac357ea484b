"""Finance report API (thin: parse the query, scope the tenants, call one report function).

Scoping is enforced here for every endpoint: finance and admin users see all tenants, anyone else
only their own. Asking for a tenant one may not see answers 404, exactly as for a tenant that does
not exist.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import incentives, reports
from billing.models import BudgetAlert, LedgerEntry
from billing.periods import fiscal_tz, fiscal_year_of, year_period
from billing.renderers import CSVRenderer
from billing.selectors import tenants_visible
from billing.token_auth import ReportTokenAuthentication

MAX_PAGE = 1000


def plain(value):
    """JSON/CSV-safe values: Decimal → exact string (never float), datetime → ISO 8601."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def parse_when(raw: str | None, *, name: str) -> datetime | None:
    if not raw:
        return None
    when = parse_datetime(raw)
    if when is None:
        day = parse_date(raw)
        if day is None:
            raise ValidationError({name: "use YYYY-MM-DD or an ISO 8601 date-time"})
        when = datetime(day.year, day.month, day.day, tzinfo=fiscal_tz())
    elif when.tzinfo is None:
        when = when.replace(tzinfo=fiscal_tz())
    return when


class ReportView(APIView):
    authentication_classes = [SessionAuthentication, ReportTokenAuthentication]  # a browser's session, a script's token
    renderer_classes = [JSONRenderer, CSVRenderer]
    csv_name = "report"

    def scope(self):
        visible = tenants_visible(user=self.request.user)
        slug = self.request.query_params.get("tenant")
        if not slug:
            return visible
        scoped = visible.filter(slug=slug)
        if not scoped.exists():
            raise Http404("No such tenant.")
        return scoped

    def period(self) -> tuple[datetime | None, datetime | None]:
        params = self.request.query_params
        return parse_when(params.get("since"), name="since"), parse_when(params.get("until"), name="until")

    def rows(self, rows: list[dict], **extra) -> Response:
        return Response({"currency": settings.FAIRGATE_CURRENCY, **plain(extra), "rows": plain(rows)})


class ChargesView(ReportView):
    csv_name = "charges"

    def get(self, request):
        since, until = self.period()
        return self.rows(reports.charges_by_month(tenants=self.scope(), since=since, until=until))


class ClassMixView(ReportView):
    csv_name = "class-mix"

    def get(self, request):
        since, until = self.period()
        rows = reports.class_mix(tenants=self.scope(), since=since, until=until)
        return self.rows(rows, overall=reports.class_mix_overall(rows))


class SpendView(ReportView):
    """Charges over a period by tenant and ``group_by``: ``key`` (tenant × class × key, with the
    key's creator), ``job`` (X-Job-Id, or a batch line's batch), ``creator``; ?key= ?job= narrow."""

    def get(self, request):
        params = request.query_params
        group_by = params.get("group_by", "key")
        if group_by not in reports.SPEND_GROUPS:
            raise ValidationError({"group_by": f"one of {', '.join(reports.SPEND_GROUPS)}"})
        self.csv_name = f"spend-by-{group_by}"
        since, until = self.period()
        rows = reports.spend_by(
            tenants=self.scope(),
            group_by=group_by,
            since=since,
            until=until,
            key_prefix=params.get("key"),
            job_id=params.get("job"),
        )
        return self.rows(rows, group_by=group_by, since=since, until=until)


class BurnView(ReportView):
    csv_name = "budget-burn"

    def get(self, request):
        raw = request.query_params.get("fiscal_year")
        if raw and not raw.isdigit():
            raise ValidationError({"fiscal_year": "a year, e.g. 2025"})
        return self.rows(reports.budget_burn(tenants=self.scope(), fiscal_year=int(raw) if raw else None))


class BurnSeriesView(ReportView):
    """Per tenant, spend by time bucket and its running total: one small chart per tenant."""

    csv_name = "burn-series"

    def get(self, request):
        since, until = self.period()
        step, rows = reports.spend_series(tenants=self.scope(), since=since, until=until)
        return self.rows(rows, step=step)


class ClassShiftView(ReportView):
    """The incentive view: per tenant, each class's share of requests in each period between price
    changes, and the premium paid (charge - base cost); ``periods`` sums the top class over all."""

    csv_name = "class-shift"

    def get(self, request):
        since, until = self.period()
        rows = incentives.class_shift(tenants=self.scope(), since=since, until=until)
        changes = [
            {
                "at": c.at,
                "class": c.class_name,
                "old": incentives.factor_text(c.old),
                "new": incentives.factor_text(c.new),
            }
            for c in incentives.price_changes(since=since, until=until)
        ]
        step, series = incentives.share_series(tenants=self.scope(), since=since, until=until)
        return self.rows(
            rows,
            top_class=incentives.top_class(),
            changes=changes,
            periods=incentives.top_share_by_period(rows),
            step=step,
            series=series,
        )


class WhatIfView(ReportView):
    csv_name = "what-if"

    def get(self, request):
        tenants = self.scope()
        if request.query_params.get("tenant") is None and tenants.count() != 1:
            raise ValidationError({"tenant": "name one tenant"})
        tenant = tenants.get()
        since, until = self.period()
        fiscal = year_period(fiscal_year_of(since or timezone.now()))
        share = self._share()
        params = request.query_params
        row = reports.what_if(
            tenant=tenant,
            since=since or fiscal.starts_at,
            until=until or fiscal.ends_at,
            share=share,
            from_class=params.get("from_class", "INTERACTIVE"),
            to_class=params.get("to_class", "BATCH"),
        )
        return self.rows([row])

    def _share(self) -> Decimal:
        raw = self.request.query_params.get("share_pct", "100")
        try:
            pct = Decimal(raw)
        except InvalidOperation:
            raise ValidationError({"share_pct": "a number from 0 to 100"}) from None
        if not pct.is_finite() or not 0 <= pct <= 100:
            raise ValidationError({"share_pct": "a number from 0 to 100"})
        return pct / 100


class LedgerView(ReportView):
    """Raw entries, newest first: ?tenant= ?kind= ?request_id= ?key_prefix= ?job_id= ?limit= (≤ 1000) ?offset="""

    csv_name = "ledger"
    COLUMNS = (
        "id",
        "kind",
        "at",
        "tenant__slug",
        "request_id",
        "class_name",
        "price_version_id",
        "model",
        "backend_name",
        "prompt_tokens",
        "completion_tokens",
        "base_cost",
        "factor",
        "amount",
        "overrun",
        "unbilled",
        "owner",
        "reason",
        "author",
        "key_prefix",
        "job_id",
        "key_creator",
    )

    def get(self, request):
        params = request.query_params
        qs = LedgerEntry.objects.filter(tenant__in=self.scope()).order_by("-at", "-pk")
        for name in ("kind", "request_id", "key_prefix", "job_id"):
            if params.get(name):
                qs = qs.filter(**{name: params[name]})
        since, until = self.period()
        qs = qs.filter(at__gte=since) if since else qs
        qs = qs.filter(at__lt=until) if until else qs
        limit, offset = self._int("limit", 100, MAX_PAGE), self._int("offset", 0, None)
        rows = [dict(r, tenant=r.pop("tenant__slug")) for r in qs.values(*self.COLUMNS)[offset : offset + limit]]
        return self.rows(rows, limit=limit, offset=offset)

    def _int(self, name: str, default: int, maximum: int | None) -> int:
        raw = self.request.query_params.get(name)
        if raw is None:
            return default
        if not raw.isdigit() or (maximum is not None and int(raw) > maximum):
            raise ValidationError({name: f"an integer from 0 to {maximum or 'any'}"})
        return int(raw)


class AlertsView(ReportView):
    csv_name = "budget-alerts"

    def get(self, request):
        qs = BudgetAlert.objects.filter(budget__tenant__in=self.scope()).select_related("budget__tenant")[:MAX_PAGE]
        rows = [
            {
                "id": a.pk,
                "tenant": a.budget.tenant.slug,
                "budget": a.budget.label,
                "threshold_pct": a.threshold_pct,
                "spent": a.spent,
                "limit": a.limit,
                "created_at": a.created_at,
                "webhook_delivered_at": a.webhook_delivered_at,
                "email_delivered_at": a.email_delivered_at,
            }
            for a in qs
        ]
        return self.rows(rows)
