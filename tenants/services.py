"""Writes for tenants and API keys, each audited. Validation errors raise `ValidationError` with a
clear message.

Class names are scheduling's: the caller passes the active ones in (``known_classes``, e.g.
``scheduling.selectors.class_names_active()``), so this app imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from tenants.keys import key_generate
from tenants.models import ApiKey, Tenant

LABEL_MAX = 200  # ApiKey.label's length: a longer one is refused, never cut
CONSOLE_ACTOR = "console:"  # the console's actors are this and the user's username


def creator_of(actor: str) -> str:
    """What a key records as its creator: a console user's username, else the actor itself."""
    return actor.removeprefix(CONSOLE_ACTOR)[:150]


def _check_share(quota_share) -> Decimal:
    try:
        share = Decimal(str(quota_share))
    except InvalidOperation:
        raise ValidationError(f"quota share {quota_share!r} is not a number") from None
    if not (Decimal(0) < share <= Decimal(1)):
        raise ValidationError(f"quota share {share} must be > 0 and <= 1")
    return share


def _check_budget(annual_budget) -> Decimal | None:
    if annual_budget is None:
        return None
    try:
        budget = Decimal(str(annual_budget))
    except InvalidOperation:
        raise ValidationError(f"annual budget {annual_budget!r} is not a number") from None
    if budget < 0:
        raise ValidationError(f"annual budget {budget} must not be negative")
    return budget


def _check_classes(classes: list[str], known: Collection[str]) -> list[str]:
    unknown = [c for c in classes if c not in known]
    if unknown:
        raise ValidationError(f"unknown class {', '.join(unknown)} (known: {', '.join(sorted(known)) or 'none'})")
    return classes


@transaction.atomic
def tenant_create(
    *,
    slug: str,
    name: str,
    quota_share,
    annual_budget=None,
    classes: list[str] | None = None,
    vip: bool = False,
    actor: str,
    known_classes: Collection[str],
) -> Tenant:
    if Tenant.objects.filter(slug=slug).exists():
        raise ValidationError(f"tenant {slug!r} already exists")
    tenant = Tenant(
        slug=slug,
        name=name,
        quota_share=_check_share(quota_share),
        annual_budget=_check_budget(annual_budget),
        allowed_classes=_check_classes(classes or [], known_classes),
        vip=vip,
    )
    tenant.full_clean()
    tenant.save()
    audit_record(
        actor=actor,
        action="create",
        entity="tenant",
        key=slug,
        new={"name": name, "quota_share": str(tenant.quota_share), "vip": vip},
    )
    return tenant


@transaction.atomic
def tenant_update(*, slug: str, actor: str, known_classes: Collection[str], **changes) -> Tenant:
    tenant = Tenant.objects.select_for_update().filter(slug=slug).first()
    if tenant is None:
        raise ValidationError(f"no tenant {slug!r}")
    checks = {
        "quota_share": _check_share,
        "annual_budget": _check_budget,
        "allowed_classes": lambda classes: _check_classes(classes, known_classes),
    }
    for field, value in changes.items():
        if value is None and field != "annual_budget":
            continue
        value = checks.get(field, lambda v: v)(value)
        old = getattr(tenant, field)
        if old != value:
            setattr(tenant, field, value)
            audit_record(actor=actor, action="update", entity="tenant", key=slug, field_name=field, old=old, new=value)
    tenant.full_clean()
    tenant.save()
    return tenant


@transaction.atomic
def apikey_create(
    *,
    tenant_slug: str,
    default_class: str,
    label: str = "",
    actor: str,
    known_classes: Collection[str],
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key (expiring at ``expires_at``, or never); return it with the full secret, which is
    never stored and shown only now."""
    tenant = Tenant.objects.filter(slug=tenant_slug, active=True).first()
    if tenant is None:
        raise ValidationError(f"no active tenant {tenant_slug!r}")
    _check_classes([default_class], known_classes)
    if len(label) > LABEL_MAX:
        raise ValidationError(f"a key's label has at most {LABEL_MAX} characters (this one has {len(label)})")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError("a key's expiry must be in the future")
    full_key, prefix, secret_hash = key_generate()
    key = ApiKey.objects.create(
        tenant=tenant,
        label=label,
        default_class=default_class,
        prefix=prefix,
        secret_hash=secret_hash,
        expires_at=expires_at,
        created_by=creator_of(actor),
    )
    created = {"tenant": tenant_slug, "class": default_class}
    if expires_at is not None:
        created["expires_at"] = expires_at.isoformat()
    audit_record(actor=actor, action="create", entity="apikey", key=prefix, new=created)
    return key, full_key


@transaction.atomic
def apikey_rotate(*, prefix: str, grace: timedelta, actor: str) -> tuple[ApiKey, str]:
    """Issues a new secret for a key: a new key with the same tenant, label, class and expiry; the
    old one keeps working for ``grace`` (or until its own expiry, if sooner), then stops. Returns the
    new key and its full secret (shown only now)."""
    old = ApiKey.objects.select_for_update().select_related("tenant").filter(prefix=prefix).first()
    if old is None:
        raise ValidationError(f"no API key with prefix {prefix!r}")
    if not old.is_active:
        raise ValidationError(f"key {prefix!r} is revoked or expired: create a new one instead")
    if old.replaced_by is not None:
        raise ValidationError(f"key {prefix!r} was already rotated (to {old.replaced_by.prefix!r}): rotate that one")
    if grace < timedelta(0):
        raise ValidationError("the grace period cannot be negative")
    full_key, new_prefix, secret_hash = key_generate()
    new = ApiKey.objects.create(
        tenant=old.tenant,
        label=old.label,
        default_class=old.default_class,
        prefix=new_prefix,
        secret_hash=secret_hash,
        expires_at=old.expires_at,
        created_by=old.created_by,  # the same key, a new secret: its spend stays its creator's
    )
    was = old.expires_at
    ends = timezone.now() + grace
    old.expires_at = ends if was is None else min(was, ends)
    old.replaced_by = new
    old.save(update_fields=["expires_at", "replaced_by"])
    audit_record(
        actor=actor,
        action="rotate",
        entity="apikey",
        key=prefix,
        old={"expires_at": was.isoformat() if was else None},
        new={"replaced_by": new_prefix, "expires_at": old.expires_at.isoformat()},
    )
    return new, full_key


@transaction.atomic
def apikey_revoke(*, prefix: str, actor: str) -> ApiKey:
    key = ApiKey.objects.select_for_update().filter(prefix=prefix).first()
    if key is None:
        raise ValidationError(f"no API key with prefix {prefix!r}")
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor, action="update", entity="apikey", key=prefix, field_name="revoked_at", new=str(key.revoked_at)
        )
    return key
