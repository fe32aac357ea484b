"""Console writes that are not policy: users, the tenant's own API keys, cancelling its batches.

Policy edits live in ``console.policy``. Every function is keyword-only, runs in one
transaction and raises ``ValidationError`` with a message a person can act on.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from batches.models import Batch
from batches.service import batch_cancel
from scheduling.models import PriorityClass
from scheduling.selectors import class_names_active, tenant_spec
from tenants.models import ApiKey, Tenant, User
from tenants.services import apikey_create, apikey_revoke, apikey_rotate

KEY_DAYS_MAX = 3660


@transaction.atomic
def user_create(
    *, username: str, role: str, tenant_slug: str | None, email: str = "", password: str | None, actor: str
) -> User:
    if role not in User.Role.values:
        raise ValidationError(f"unknown role {role!r} (roles: {', '.join(User.Role.values)})")
    if User.objects.filter(username=username).exists():
        raise ValidationError(f"user {username!r} already exists")
    tenant = None
    if tenant_slug:
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise ValidationError(f"no tenant {tenant_slug!r}")
    if role == User.Role.MEMBER and tenant is None:
        raise ValidationError("a member belongs to a tenant: give --tenant SLUG")
    user = User(username=username, role=role, tenant=tenant, email=email)
    user.full_clean(exclude=["password"])
    if password is None:
        user.set_unusable_password()
    else:
        validate_password(password, user)
        user.set_password(password)
    user.save()
    audit_record(
        actor=actor,
        action="create",
        entity="user",
        key=username,
        new={"role": role, "tenant": tenant.slug if tenant else None},
    )
    return user


def key_classes(tenant: Tenant) -> list[str]:
    """Classes a key of ``tenant`` may default to: its allowed classes, else every active class."""
    active = list(PriorityClass.objects.filter(active=True).order_by("level").values_list("name", flat=True))
    allowed = set(tenant_spec(tenant).classes)
    return [c for c in active if not allowed or c in allowed]


def tenant_key_create(
    *, tenant: Tenant, default_class: str, label: str, actor: str, expires_days: str = ""
) -> tuple[ApiKey, str]:
    """A key for the caller's own tenant (expiring after ``expires_days``, blank: never); the full
    secret is returned once and never stored."""
    if default_class not in key_classes(tenant):
        raise ValidationError(
            f"class {default_class!r} is not one your tenant may use ({', '.join(key_classes(tenant)) or 'none'})"
        )
    expires_at = None
    if expires_days.strip():
        try:
            days = int(expires_days)
        except ValueError:
            raise ValidationError("give the key's lifetime in whole days, or leave it blank for none") from None
        if not 1 <= days <= KEY_DAYS_MAX:
            raise ValidationError(f"a key's lifetime is 1 to {KEY_DAYS_MAX} days")
        expires_at = timezone.now() + timedelta(days=days)
    return apikey_create(
        tenant_slug=tenant.slug,
        default_class=default_class,
        label=label,
        actor=actor,
        known_classes=class_names_active(),
        expires_at=expires_at,
    )


def tenant_key_rotate(*, tenant: Tenant, prefix: str, actor: str) -> tuple[ApiKey, str]:
    """Rotates one of the tenant's keys (tenants.services.apikey_rotate), the old one valid for
    FAIRGATE_KEY_ROTATION_GRACE_H more hours."""
    if not ApiKey.objects.filter(prefix=prefix, tenant=tenant).exists():
        raise ValidationError(f"no API key with prefix {prefix!r} in your tenant")
    grace = timedelta(hours=settings.FAIRGATE_KEY_ROTATION_GRACE_H)
    return apikey_rotate(prefix=prefix, grace=grace, actor=actor)


def tenant_key_revoke(*, tenant: Tenant, prefix: str, actor: str) -> ApiKey:
    """Revoke one of the tenant's keys; another tenant's prefix is 'not found', like a missing one."""
    if not ApiKey.objects.filter(prefix=prefix, tenant=tenant).exists():
        raise ValidationError(f"no API key with prefix {prefix!r} in your tenant")
    return apikey_revoke(prefix=prefix, actor=actor)


@transaction.atomic
def tenant_batch_cancel(*, tenant: Tenant, batch_id: str, actor: str) -> Batch:
    """Cancels one of the tenant's batches (batches.service.batch_cancel: another tenant's is not
    found, FileRefused 404), recorded in the audit log when it was running."""
    was = Batch.objects.filter(tenant=tenant, id=batch_id).values_list("status", flat=True).first()
    batch = batch_cancel(tenant_id=tenant.pk, batch_id=batch_id)
    if was != batch.status:
        audit_record(actor=actor, action="cancel", entity="batch", key=batch_id, old=was, new=batch.status)
    return batch
