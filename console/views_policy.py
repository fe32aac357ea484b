"""Policy (admin): classes and prices, aging, fairness, tenant shares, downgrade rules, backends.

Each POST calls one service of ``console.policy`` (validated like the YAML, audited) and comes
back to the page with what happened; a refused change says why. A price factor moved more than
2x is a confirm step: a page saying what it touches, whose form posts the change again confirmed.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib import messages
from django.contrib.messages.storage.base import Message
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from console import policy
from console.access import ADMIN, role_required
from console.policy_view import policy_context
from console.wording import sla_minutes
from scheduling.prices import MAX_STEP, ConfirmNeeded
from scheduling.selectors import config_live

SAVED = "Saved: the running scheduler picks it up within a second."
AT = "at:"
MS_PER_MINUTE = 60_000


@role_required(ADMIN)
def policy_page(request: HttpRequest) -> HttpResponse:
    return render(request, "console/policy.html", policy_context(_feedback(request)))


def _actor(request: HttpRequest) -> str:
    return f"console:{request.user.username}"


def _apply(request: HttpRequest, target: str, action: Callable[[], str | None]) -> HttpResponse:
    """Run one change; its outcome is shown next to the form it came from (``target``)."""
    try:
        note = action()
        messages.success(request, note or SAVED, extra_tags=AT + target)
    except ConfirmNeeded:
        raise  # the caller's confirm step
    except ValidationError as exc:
        messages.error(request, "Refused: " + "; ".join(exc.messages), extra_tags=AT + target)
    return redirect(f"/console/policy/#{target}")


def _feedback(request: HttpRequest) -> dict[str, Message]:
    """The outcomes of the last changes, by the form they belong to."""
    return {m.extra_tags[len(AT) :]: m for m in messages.get_messages(request) if m.extra_tags.startswith(AT)}


def _note(result) -> str:
    return SAVED if result.changed else "Nothing changed: the live policy already says that."


def _post(request: HttpRequest, name: str) -> str:
    return request.POST.get(name, "").strip()


def _when(raw: str):
    if not raw:
        return None
    when = parse_datetime(raw)
    if when is None:
        raise ValidationError(f"effective at: {raw!r} is not a date-time (YYYY-MM-DDTHH:MM)")
    return timezone.make_aware(when) if timezone.is_naive(when) else when


@require_POST
@role_required(ADMIN)
def class_edit(request: HttpRequest, name: str) -> HttpResponse:
    def action() -> str | None:
        notes = []
        factor = policy.number(_post(request, "price_factor"), what="price factor")
        if factor is not None:  # first: a price that asks for confirmation saves nothing yet
            version = policy.class_price_set(
                class_name=name,
                price_factor=factor,
                actor=_actor(request),
                effective_at=_when(_post(request, "effective_at")),
                confirm=request.POST.get("confirm") == "yes",
            )
            notes.append(
                f"{name} price ×{version.price_factor} (version {version.pk}) "
                f"from {timezone.localtime(version.effective_at):%Y-%m-%d %H:%M:%S %Z}"
            )
        sla_ms = _sla_ms(request)
        if sla_ms is not None:
            policy.class_sla_set(class_name=name, sla_ms=sla_ms, actor=_actor(request))
            notes.append(f"{name} target wait {sla_minutes(sla_ms)} min")
        if not notes:
            raise ValidationError("nothing to change: give an SLA or a price factor")
        return "Saved: " + "; ".join(notes) + "."

    try:
        return _apply(request, f"class-{name}", action)
    except ConfirmNeeded as asked:
        return _price_confirm(request, name, asked)


def _sla_ms(request: HttpRequest) -> int | None:
    """The SLA posted in minutes (the form) or in milliseconds (scripts), in milliseconds."""
    minutes = policy.number(_post(request, "sla_min"), what="target wait (minutes)")
    if minutes is None:
        return policy.number(_post(request, "sla_ms"), what="SLA (ms)", kind=int)
    if not minutes.is_finite():
        raise ValidationError(f"target wait: {minutes} is not a number of minutes")
    sla_ms = int(minutes * MS_PER_MINUTE)
    if sla_ms < 1:
        raise ValidationError("target wait: give more than 0 minutes")
    return sla_ms


def _price_confirm(request: HttpRequest, name: str, asked: ConfirmNeeded) -> HttpResponse:
    """The confirm step: what the change touches, and the same change to post again, confirmed."""
    posted = {field: _post(request, field) for field in ("price_factor", "effective_at", "sla_min", "sla_ms")}
    context = {
        "name": name,
        "impacts": asked.impacts,
        "posted": {field: value for field, value in posted.items() if value},
        "max_step": MAX_STEP,
        "currency": settings.FAIRGATE_CURRENCY,
    }
    return render(request, "console/price_confirm.html", context)


@require_POST
@role_required(ADMIN)
def aging_edit(request: HttpRequest) -> HttpResponse:
    def action() -> str:
        segments = policy.segments_parse(request.POST.get("segments", ""))
        return _note(policy.aging_set(mode=_post(request, "mode"), segments=segments, actor=_actor(request)))

    return _apply(request, "aging", action)


@require_POST
@role_required(ADMIN)
def fairness_edit(request: HttpRequest) -> HttpResponse:
    def action() -> str:
        min_share = policy.number(_post(request, "min_share"), what="min_share", kind=float)
        return _note(policy.fairness_set(mode=_post(request, "mode"), min_share=min_share, actor=_actor(request)))

    return _apply(request, "fairness", action)


@require_POST
@role_required(ADMIN)
def tenant_edit(request: HttpRequest, slug: str) -> HttpResponse:
    def action() -> None:
        share = policy.number(_post(request, "quota_share"), what="quota share")
        if share is None:
            raise ValidationError("give a quota share (0 < share <= 1)")
        policy.tenant_share_set(slug=slug, quota_share=share, actor=_actor(request))

    return _apply(request, f"tenant-{slug}", action)


@require_POST
@role_required(ADMIN)
def rule_edit(request: HttpRequest) -> HttpResponse:
    name = _post(request, "name")

    def action() -> str:
        if request.POST.get("delete"):
            return _note(policy.rule_delete(name=name, actor=_actor(request)))
        return _note(
            policy.rule_save(
                name=name,
                condition=_post(request, "condition"),
                action=_post(request, "action"),
                enabled=request.POST.get("enabled") == "on",
                actor=_actor(request),
            )
        )

    known = {rule.name for rule in config_live().downgrade_rules}
    return _apply(request, f"rule-{name}" if name in known else "rule-new", action)


def _backend_values(request: HttpRequest) -> dict:
    values = {
        "slots": policy.number(_post(request, "slots"), what="slots", kind=int),
        "reserved_slots": policy.number(_post(request, "reserved_slots"), what="reserved slots", kind=int),
        "tpm": policy.number(_post(request, "tpm"), what="TPM", kind=int),
        "rpm": policy.number(_post(request, "rpm"), what="RPM", kind=int),
        "input_price_per_1k": policy.number(_post(request, "input_price_per_1k"), what="input price"),
        "output_price_per_1k": policy.number(_post(request, "output_price_per_1k"), what="output price"),
        "fallback_for": _post(request, "fallback_for") or None,
        "enabled": request.POST.get("enabled") == "on",
    }
    for required in ("slots", "reserved_slots", "input_price_per_1k", "output_price_per_1k"):
        if values[required] is None:
            raise ValidationError(f"{required.replace('_', ' ')} is required")
    return values


@require_POST
@role_required(ADMIN)
def backend_edit(request: HttpRequest, name: str) -> HttpResponse:
    return _apply(
        request,
        f"backend-{name}",
        lambda: _note(policy.backend_set(name=name, values=_backend_values(request), actor=_actor(request))),
    )
