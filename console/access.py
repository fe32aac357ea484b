"""Who may see what in the console. Every view and the WebSocket consumer ask here, once.

Roles (``tenants.User.role``): ``member`` sees its own tenant only; ``finance`` sees every
tenant's charges and budgets, read-only; ``admin`` sees everything and changes configuration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import import_module

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.decorators import login_required
from django.contrib.sessions.backends import db as db_sessions
from django.core.exceptions import PermissionDenied
from django.db.models import Subquery
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from tenants.models import Tenant, User

MEMBER, FINANCE, ADMIN = User.Role.MEMBER, User.Role.FINANCE, User.Role.ADMIN


def role_of(user) -> str | None:
    if not getattr(user, "is_authenticated", False):
        return None
    if user.is_superuser:
        return ADMIN
    return user.role


def is_admin(user) -> bool:
    return role_of(user) == ADMIN


def home_path(user) -> str:
    """Where /console/ sends a user: admins to operations, finance to finance, members to their queue."""
    role = role_of(user)
    if role == ADMIN:
        return "/console/ops/"
    if role == FINANCE:
        return "/console/finance/"
    return "/console/queue/"


def queue_tenant(user, requested_slug: str | None = None) -> Tenant | None:
    """The tenant whose queue a user watches: always their own, except that an admin may name one.

    Whatever a member asks for, the answer is the member's own tenant (or None without one).
    """
    if is_admin(user) and requested_slug:
        return Tenant.objects.filter(slug=requested_slug).first()
    if getattr(user, "tenant_id", None) is None:
        return None
    return Tenant.objects.filter(pk=user.tenant_id).first()


def may_watch_tenant(user, tenant_id: int) -> bool:
    """Whether ``user`` may still watch the queue of ``tenant_id`` (admins any, others their own)."""
    return is_admin(user) or getattr(user, "tenant_id", None) == tenant_id


def console_user_current(*, user_id: int, session_key: str | None) -> User | None:
    """The user of an open console socket as the database has it now, or None once they may no
    longer watch: deleted, inactive, or their session ended (signed out, expired, password
    changed). One query with the database session engine (the default)."""
    if not session_key:
        return None
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    users = User.objects.filter(pk=user_id)
    user: User | None
    if store_class is db_sessions.SessionStore:
        alive = store_class.get_model_class().objects.filter(session_key=session_key, expire_date__gt=timezone.now())
        user = users.annotate(session_data=Subquery(alive.values("session_data")[:1])).first()
        data = getattr(user, "session_data", None)
        session = store_class().decode(data) if data else {}
    else:
        session = store_class(session_key).load()
        user = users.first()
    if user is None or not user.is_active or not _session_is_of(session, user):
        return None
    return user


def _session_is_of(session: dict, user: User) -> bool:
    """What ``django.contrib.auth.get_user`` checks of a session: its user, backend and auth hash."""
    if (
        str(session.get(SESSION_KEY)) != str(user.pk)
        or session.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS
    ):
        return False
    session_hash = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return bool(session_hash) and any(constant_time_compare(session_hash, h) for h in hashes)


def role_required(*roles: str) -> Callable:
    """Login (redirect to the login page), then 403 unless the user has one of ``roles``."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @functools.wraps(view)
        def guarded(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if role_of(request.user) not in roles:
                raise PermissionDenied("Your role does not give access to this page.")
            return view(request, *args, **kwargs)

        return guarded

    return wrap
