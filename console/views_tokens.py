"""Report tokens on the console: each user lists, creates (shown once) and revokes their own."""

from __future__ import annotations

from typing import cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from audit.services import audit_record
from tenants.models import ReportToken, User
from tenants.tokens import DAYS_DEFAULT, DAYS_MAX, token_create, token_revoke


@login_required
@never_cache
def tokens_page(request: HttpRequest) -> HttpResponse:
    context = {
        "tokens": ReportToken.objects.filter(user=cast(User, request.user)),
        "days_default": DAYS_DEFAULT,
        "days_max": DAYS_MAX,
        "created": request.session.pop("report_token_created", None),  # shown once
    }
    return render(request, "console/tokens.html", context)


@login_required
@require_POST
def token_add(request: HttpRequest) -> HttpResponse:
    try:
        days = int(request.POST.get("days") or DAYS_DEFAULT)
        label = request.POST.get("label", "").strip()
        full, token = token_create(user=cast(User, request.user), label=label, days=days)
    except ValueError:
        messages.error(request, "Give the token's lifetime in whole days.")
        return redirect("console:tokens")
    except ValidationError as err:
        messages.error(request, "; ".join(err.messages))
        return redirect("console:tokens")
    audit_record(
        actor=f"console:{request.user.username}",
        action="create",
        entity="report_token",
        key=token.prefix,
        new={"user": request.user.username, "label": token.label, "expires_at": token.expires_at.isoformat()},
    )
    request.session["report_token_created"] = full
    return redirect("console:tokens")


@login_required
@require_POST
def token_delete(request: HttpRequest, prefix: str) -> HttpResponse:
    token = ReportToken.objects.filter(user=cast(User, request.user), prefix=prefix).first()
    if token is None:
        raise Http404("No such token of yours.")
    if token_revoke(token):
        audit_record(actor=f"console:{request.user.username}", action="revoke", entity="report_token", key=prefix)
        messages.success(request, f"Revoked fgr_{prefix}…: scripts using it now get 401.")
    return redirect("console:tokens")
