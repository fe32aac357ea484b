"""OpenID Connect sign-in (mozilla-django-oidc) against the provider named by FAIRGATE_OIDC_ISSUER:
its endpoints come from the provider's discovery document, and a user's tenant and role from
`tenants.signin`'s rules (docs/sign-in.md)."""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from tenants.models import User
from tenants.signin import claim_values, mapped, signed_in, username_for

log = logging.getLogger(__name__)
ENDPOINTS = {  # mozilla-django-oidc's setting -> the discovery document's field
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
REFUSED_SESSION_KEY = "signin_refused"  # why the last sign-in was refused, for the page that says so
_discovered: dict[str, dict] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(settings.FAIRGATE_OIDC_ISSUER)


def discovery() -> dict:
    """The provider's discovery document, fetched once per process (a failure is retried next time)."""
    issuer = settings.FAIRGATE_OIDC_ISSUER.rstrip("/")
    with _lock:
        found = _discovered.get(issuer)
        if found is None:
            response = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=10)
            response.raise_for_status()
            found = _discovered[issuer] = response.json()
    return found


def provider_setting(attr: str, *default):
    """mozilla-django-oidc's settings, the provider's endpoints taken from its discovery document."""
    if attr in ENDPOINTS:
        try:
            return discovery()[ENDPOINTS[attr]]
        except (requests.RequestException, ValueError, KeyError) as exc:
            log.warning("OpenID provider discovery failed: %s", exc)
            return ""
    return import_from_settings(attr, *default)


def logout_url(request) -> str | None:
    """The provider's end-session URL for a session signed in through it (RP-initiated logout), or
    None (a local session, or a provider without one)."""
    id_token = request.session.get("oidc_id_token")
    if not id_token or not enabled():
        return None
    try:
        end_session = discovery().get("end_session_endpoint")
    except (requests.RequestException, ValueError):
        return None
    if not end_session:
        return None
    query = {
        "id_token_hint": id_token,
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(settings.LOGOUT_REDIRECT_URL),
    }
    return f"{end_session}?{urlencode(query)}"


class Backend(OIDCAuthenticationBackend):
    """Signs in a provider's user whose claims a rule maps; refuses (None) one they map to nothing
    and a user an admin deactivated. The rules apply at every sign-in."""

    get_settings = staticmethod(provider_setting)

    def verify_claims(self, claims) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims):
        return User.objects.filter(username=username_for(str(claims.get("sub"))))

    def get_or_create_user(self, access_token, id_token, payload):
        claims = {**payload, **self.get_userinfo(access_token, id_token, payload)}
        if not self.verify_claims(claims):
            raise SuspiciousOperation("the provider gave no subject")
        subject = str(claims["sub"])
        known = User.objects.filter(username=username_for(subject)).first()
        if known is not None and not known.is_active:
            return self._refused("deactivated", claims)
        found = mapped(claims, settings.FAIRGATE_OIDC_CLAIM)
        if found is None:
            return self._refused("unmapped", claims)
        self.request.session.pop(REFUSED_SESSION_KEY, None)
        return signed_in(subject, claims, found)

    def _refused(self, reason: str, claims: dict) -> None:
        self.request.session[REFUSED_SESSION_KEY] = {
            "reason": reason,
            "who": str(claims.get("email") or claims.get("preferred_username") or claims.get("sub")),
            "values": claim_values(claims, settings.FAIRGATE_OIDC_CLAIM)[:20],
        }
        log.info("sign-in refused (%s): %s", reason, claims.get("sub"))
        return None
