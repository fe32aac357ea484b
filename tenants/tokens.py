"""Report tokens: personal, read-only, expiring access to the report API for scripts (finance's
monthly CSV). Created and revoked by their user (console) or an operator (`manage.py reporttoken`)."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.utils import timezone

from tenants.keys import REPORT_TOKEN_PREFIX, key_generate, key_matches, key_prefix
from tenants.models import ReportToken, User

DAYS_DEFAULT, DAYS_MAX = 90, 366
LAST_USED_EVERY = timedelta(minutes=1)  # "last used" is written at most this often per token


def token_create(*, user: User, label: str, days: int) -> tuple[str, ReportToken]:
    """A new token of ``user`` valid for ``days``; returns its full text (shown once) and its row."""
    if not 1 <= days <= DAYS_MAX:
        raise ValidationError(f"a report token lasts 1 to {DAYS_MAX} days, not {days}")
    if len(label) > 200:
        raise ValidationError("a token's label has at most 200 characters")
    if not user.is_active:
        raise ValidationError(f"user {user.username!r} is deactivated")
    full, prefix, digest = key_generate(REPORT_TOKEN_PREFIX)
    token = ReportToken.objects.create(
        user=user, label=label, prefix=prefix, secret_hash=digest, expires_at=timezone.now() + timedelta(days=days)
    )
    return full, token


def token_revoke(token: ReportToken) -> bool:
    """Revokes ``token``; False if it already was."""
    if token.revoked_at is not None:
        return False
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    return True


def token_user(full: str) -> tuple[User, ReportToken] | None:
    """The user a presented report token stands for, or None: unknown, wrong secret, revoked,
    expired, or its user deactivated."""
    prefix = key_prefix(full, REPORT_TOKEN_PREFIX)
    if prefix is None:
        return None
    token = ReportToken.objects.select_related("user").filter(prefix=prefix).first()
    now = timezone.now()
    if token is None or not key_matches(full, token.secret_hash):
        return None
    if token.revoked_at is not None or token.expires_at <= now or not token.user.is_active:
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_EVERY:
        ReportToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user, token


def token_looks_like(text: str) -> bool:
    return text.startswith(REPORT_TOKEN_PREFIX + "_")
