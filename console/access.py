"""Who may see what in the console. Every view and the WebSocket consumer ask here, once.

Roles (``tenants.User.role``): ``member`` sees its own tenant only; ``finance`` sees every
tenant's charges and budgets, read-only; ``admin`` sees everything and changes configuration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

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
