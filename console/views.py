"""Console entry, the member's queue page, its API keys and its JSON reads.

Pages are server-rendered; live parts are filled by WebSocket pushes (static/console/queue.js).
The tenant is always the one ``console.access.queue_tenant`` gives for the logged-in user.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from batches.files import FileRefused
from console import access, selectors, services
from console.access import ADMIN, MEMBER, role_required
from console.live.db import batches_for
from console.live.jobs import JobMoney, job_cards, job_tallies, waits_by_minute
from console.live.snapshot import MAX_ROWS, request_card, tenant_queue
from gateway.api import current

QUEUE_ROLES = (MEMBER, ADMIN)
MAX_PAGE = 500


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect(access.home_path(request.user))


def _tenant_or_403(request: HttpRequest):
    asked = request.GET.get("tenant") or request.POST.get("tenant")
    tenant = access.queue_tenant(request.user, asked)
    if tenant is None and access.is_admin(request.user):
        raise Http404(f"No tenant '{(asked or '')[:64]}': pick one on My queue.")
    if tenant is None:
        raise PermissionDenied("Your account belongs to no tenant, so it has no queue: ask an administrator.")
    return tenant


def _actor(request: HttpRequest) -> str:
    return f"console:{request.user.username}"


@role_required(*QUEUE_ROLES)
def queue_page(request: HttpRequest) -> HttpResponse:
    if access.is_admin(request.user) and not request.GET.get("tenant"):  # no tenant of their own: pick one
        return render(request, "console/tenant_pick.html", {"tenants": selectors.tenants_all()})
    tenant = _tenant_or_403(request)
    context = {
        "tenant": tenant,
        "budget": selectors.budget_of(tenant=tenant),
        "charges": selectors.charges_recent(tenant=tenant),
        "downgrades": selectors.downgrades_recent(tenant=tenant),
        "alerts": selectors.alerts_recent(tenant=tenant),
        "keys": selectors.keys_of(tenant=tenant),
        "batches": batches_for([tenant.pk]).get(tenant.pk, []),
        "key_classes": services.key_classes(tenant),
        "ws_query": f"?tenant={tenant.slug}" if access.is_admin(request.user) else "",
        "own_queue": getattr(request.user, "tenant_id", None) == tenant.pk,
    }
    return render(request, "console/queue.html", context)


@never_cache
@require_POST
@role_required(*QUEUE_ROLES)
def key_create(request: HttpRequest) -> HttpResponse:
    tenant = _tenant_or_403(request)
    try:
        key, secret = services.tenant_key_create(
            tenant=tenant,
            default_class=request.POST.get("default_class", ""),
            label=request.POST.get("label", ""),
            actor=_actor(request),
            expires_days=request.POST.get("expires_days", ""),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect(_queue_url(request, tenant))
    response = render(
        request,
        "console/key_created.html",
        {"key": key, "secret": secret, "tenant": tenant, "back": _queue_url(request, tenant)},
    )
    return response


@require_POST
@role_required(*QUEUE_ROLES)
def key_rotate(request: HttpRequest, prefix: str) -> HttpResponse:
    """A new secret for a key; asks first, naming when the old one stops."""
    tenant = _tenant_or_403(request)
    grace_h = settings.FAIRGATE_KEY_ROTATION_GRACE_H
    if request.POST.get("confirm") != "yes":
        if selectors.key_revoke_effects(tenant=tenant, prefix=prefix) is None:
            raise Http404("No such active key in your tenant.")
        effects = [
            "A new key is made with the same label and class, shown once.",
            f"The old key {prefix}… keeps working for {grace_h} h more, then is refused (401): move every"
            " client to the new key before then.",
        ]
        return _confirm(request, tenant, f"Rotate key {prefix}…?", effects, "Rotate the key")
    try:
        key, secret = services.tenant_key_rotate(tenant=tenant, prefix=prefix, actor=_actor(request))
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect(_queue_url(request, tenant))
    replaced = key.replaces.first()
    context = {
        "key": key,
        "secret": secret,
        "tenant": tenant,
        "back": _queue_url(request, tenant),
        "replaced": replaced,
    }
    return render(request, "console/key_created.html", context)


@require_POST
@role_required(*QUEUE_ROLES)
def key_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    tenant = _tenant_or_403(request)
    if request.POST.get("confirm") != "yes":
        effects = selectors.key_revoke_effects(tenant=tenant, prefix=prefix)
        if effects is None:
            raise Http404("No such active key in your tenant.")
        return _confirm(request, tenant, f"Revoke key {prefix}…?", effects, "Revoke the key")
    try:
        services.tenant_key_revoke(tenant=tenant, prefix=prefix, actor=_actor(request))
    except ValidationError:
        raise Http404("No such key in your tenant.") from None
    messages.success(request, f"Key {prefix}… revoked: it stops working within a second.")
    return redirect(_queue_url(request, tenant))


@require_POST
@role_required(*QUEUE_ROLES)
def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    tenant = _tenant_or_403(request)
    if request.POST.get("confirm") != "yes":
        effects = selectors.batch_cancel_effects(tenant=tenant, batch_id=batch_id)
        if effects is not None:  # else it is not running: cancelling it again changes nothing
            return _confirm(request, tenant, f"Cancel batch {batch_id}?", effects, "Cancel the batch")
    try:
        batch = services.tenant_batch_cancel(tenant=tenant, batch_id=batch_id, actor=_actor(request))
    except FileRefused:
        raise Http404("No such batch in your tenant.") from None
    messages.success(request, f"Batch {batch.id} is {batch.status}: no more of its lines start; running ones finish.")
    return redirect(_queue_url(request, tenant))


def _confirm(request: HttpRequest, tenant, title: str, effects: list[str], button: str) -> HttpResponse:
    """The step before an action that stops work: what it stops, and the same POST, confirmed."""
    back = _queue_url(request, tenant)
    context = {"title": title, "effects": effects, "button": button, "tenant": tenant, "back": back}
    return render(request, "console/confirm.html", context)


def _queue_url(request: HttpRequest, tenant) -> str:
    return f"/console/queue/?tenant={tenant.slug}" if access.is_admin(request.user) else "/console/queue/"


# --- JSON reads (async: the dispatcher is read on its own event loop) -------------------------


async def _api_tenant(request: HttpRequest):
    user = await request.auser()
    if not user.is_authenticated:
        return None, JsonResponse({"error": "log in first"}, status=401)
    if access.role_of(user) not in QUEUE_ROLES:
        return None, JsonResponse({"error": "your role has no queue"}, status=403)
    tenant = await sync_to_async(access.queue_tenant)(user, request.GET.get("tenant"))
    if tenant is None:
        return None, JsonResponse({"error": "no tenant"}, status=404)
    return tenant, None


def _page(request: HttpRequest) -> tuple[int, int] | None:
    """?offset= and ?limit= (at most MAX_PAGE rows); None when either is not a number in range."""
    raw_offset, raw_limit = request.GET.get("offset", "0"), request.GET.get("limit", str(MAX_ROWS))
    if not (raw_offset.isdigit() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_PAGE:
        return None
    return int(raw_offset), int(raw_limit)


async def api_queue(request: HttpRequest) -> HttpResponse:
    """The member's queue: jobs (with progress and ``eta_ms``), batch cards, and one page of the
    request table (``?offset=&limit=``, nearest to service first)."""
    tenant, refused = await _api_tenant(request)
    if refused:
        return refused
    page = _page(request)
    if page is None:
        return JsonResponse({"error": f"offset: an integer from 0; limit: an integer from 1 to {MAX_PAGE}"}, status=400)
    d = current()
    offset, limit = page
    queue: dict = {"total": 0, "counts": {}, "rows": [], "offset": offset, "limit": limit, "truncated": False}
    jobs: list[dict] = []
    if d is not None:
        await d.fresh()
        now_ms = d.now_ms()
        queue = tenant_queue(d, tenant.slug, now_ms, offset=offset, limit=limit)
        tallies = job_tallies(d, tenant.slug, now_ms)
        jobs = await sync_to_async(job_cards)(tallies, tenant_id=tenant.pk, slug=tenant.slug, memo=JobMoney())
    cards = await sync_to_async(batches_for)([tenant.pk])
    return JsonResponse({"tenant": tenant.slug, **queue, "jobs": jobs, "batches": cards.get(tenant.pk, [])})


async def api_waits(request: HttpRequest) -> HttpResponse:
    """The tenant's waits by class over the last hour, per minute (requests finished in this process)."""
    tenant, refused = await _api_tenant(request)
    if refused:
        return refused
    d = current()
    rows = waits_by_minute(d, tenant.slug, d.now_ms()) if d is not None else []
    return JsonResponse({"tenant": tenant.slug, "rows": rows})


async def api_request(request: HttpRequest, request_id: str) -> HttpResponse:
    tenant, refused = await _api_tenant(request)
    if refused:
        return refused
    card = request_card(current(), tenant.slug, request_id)
    charge = await sync_to_async(selectors.charge_of)(tenant=tenant, request_id=request_id)
    if card is None and charge is None:
        return JsonResponse({"error": f"no request {request_id[:128]!r} of yours"}, status=404)
    return JsonResponse({"id": request_id, "request": card, "charge": charge})
