"""Finance (finance, admin), operations and the audit log (admin).

Finance tables and charts are drawn in the browser from billing's report API (/api/billing/…),
which scopes tenants on the server; nothing is recomputed here.
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from billing.alerts import alerts_failed
from billing.selectors import tenants_visible
from console import selectors
from console.access import ADMIN, FINANCE, role_required
from console.wording import audit_changes

FAILED_ALERTS_SHOWN = 50

AUDIT_PAGE = 50


@role_required(FINANCE, ADMIN)
def finance_page(request: HttpRequest) -> HttpResponse:
    tenants = list(tenants_visible(user=request.user).values_list("slug", flat=True))
    return render(request, "console/finance.html", {"tenants": tenants})


@role_required(ADMIN)
def ops_page(request: HttpRequest) -> HttpResponse:
    return render(request, "console/ops.html", {"failed_alerts": alerts_failed()[:FAILED_ALERTS_SHOWN]})


@role_required(ADMIN)
def audit_page(request: HttpRequest) -> HttpResponse:
    entity = request.GET.get("entity") or ""
    page = Paginator(selectors.audit_rows(entity=entity), AUDIT_PAGE).get_page(request.GET.get("page"))
    for row in page:
        row.changes = audit_changes(row.field, row.old, row.new)
    return render(
        request, "console/audit.html", {"page": page, "entity": entity, "entities": selectors.audit_entities()}
    )
