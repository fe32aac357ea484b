"""Signing in and out of the console: local passwords (unless switched off), the company's OpenID
provider (tenants.oidc), the page that says why a sign-in was refused, and the admins' page of
sign-in rules (docs/sign-in.md)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from mozilla_django_oidc import views as oidc_views

from audit.services import audit_record
from console.access import ADMIN, role_required
from tenants import oidc
from tenants.models import SignInRule, Tenant, User
from tenants.signin import SignInRuleError, rule_checked

REFUSED_PATH = "/console/sso/refused/"


class LoginView(auth_views.LoginView):
    """The login page: the provider's button when one is configured, the password form unless
    FAIRGATE_LOCAL_LOGIN is off (then a password POST is refused)."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        if not settings.FAIRGATE_LOCAL_LOGIN:
            return HttpResponse("Password logins are switched off here: use the company sign-in.", status=403)
        return super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs):
        return {
            **super().get_context_data(**kwargs),
            "sso": oidc.enabled(),
            "sso_name": settings.FAIRGATE_OIDC_NAME,
            "local_login": settings.FAIRGATE_LOCAL_LOGIN,
        }


class SignInStart(oidc_views.OIDCAuthenticationRequestView):
    get_settings = staticmethod(oidc.provider_setting)

    def get(self, request):
        if not oidc.enabled():
            raise Http404("No company sign-in is configured.")
        request.session.pop(oidc.REFUSED_SESSION_KEY, None)
        return super().get(request)


class SignInCallback(oidc_views.OIDCAuthenticationCallbackView):
    get_settings = staticmethod(oidc.provider_setting)

    @property
    def failure_url(self) -> str:
        return REFUSED_PATH


def refused(request: HttpRequest) -> HttpResponse:
    """Why the last company sign-in did not let the user in, and whom to ask."""
    why = request.session.get(oidc.REFUSED_SESSION_KEY) or {"reason": "failed", "who": "", "values": []}
    context = {"why": why, "claim": settings.FAIRGATE_OIDC_CLAIM, "contact": settings.FAIRGATE_SIGNIN_CONTACT}
    return render(request, "console/signin_refused.html", context, status=403)


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    """Ends the Fairgate session; a provider session is then ended at the provider too."""
    provider_logout = oidc.logout_url(request)
    auth.logout(request)
    return HttpResponseRedirect(provider_logout or settings.LOGOUT_REDIRECT_URL)


@role_required(ADMIN)
def rules_page(request: HttpRequest) -> HttpResponse:
    context = {
        "rules": SignInRule.objects.select_related("tenant"),
        "tenants": Tenant.objects.filter(active=True),
        "roles": User.Role.choices,
        "claim": settings.FAIRGATE_OIDC_CLAIM,
        "sso": oidc.enabled(),
    }
    return render(request, "console/signin_rules.html", context)


@role_required(ADMIN)
@require_POST
def rule_add(request: HttpRequest) -> HttpResponse:
    actor = f"console:{request.user.username}"
    try:
        value, slug, role = rule_checked(
            request.POST.get("value", ""), request.POST.get("tenant") or None, request.POST.get("role"), where="rule"
        )
        if SignInRule.objects.filter(claim_value=value).exists():
            raise SignInRuleError(f"rule: {value!r} already has a rule; remove it first")
    except SignInRuleError as err:
        messages.error(request, str(err).removeprefix("rule: "))
        return redirect("console:signin-rules")
    last = SignInRule.objects.order_by("-position").values_list("position", flat=True).first()
    rule = SignInRule.objects.create(
        position=(last or 0) + 1, claim_value=value, tenant=Tenant.objects.filter(slug=slug).first(), role=role
    )
    audit_record(actor=actor, action="create", entity="signin_rule", key=value, new=str(rule))
    messages.success(request, f"Added: {rule}. It applies at each user's next sign-in.")
    return redirect("console:signin-rules")


@role_required(ADMIN)
@require_POST
def rule_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = SignInRule.objects.select_related("tenant").filter(pk=rule_id).first()
    if rule is None:
        raise Http404("No such rule.")
    actor = f"console:{request.user.username}"
    audit_record(actor=actor, action="delete", entity="signin_rule", key=rule.claim_value, old=str(rule))
    rule.delete()
    messages.success(request, f"Removed: {rule}. Users it let in keep their access until their next sign-in.")
    return redirect("console:signin-rules")
