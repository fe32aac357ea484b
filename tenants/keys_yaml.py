"""API keys in the configuration YAML (`scheduler_config dump/load`, top-level ``api_keys:``).

The dump lists every key without its secret: prefix, tenant, label, class, creator, expiry,
revocation and rotation. A load changes existing keys only, found by prefix: their expiry, and
revocation (never undone). A prefix that names no key is refused: secrets are never made from a
file. Every change is audited as the console's are. Rules: docs/configuration.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.services import audit_record
from tenants.models import ApiKey
from tenants.services import apikey_revoke

SECTION = "api_keys"
LOADED = ("expires_at", "revoked")  # what a load may change
CHECKED = ("tenant", "replaced_by")  # must match the key: a file cannot move a key or undo a rotation
SHOWN = ("label", "class", "created_by", "state")  # written by the dump, ignored by a load
KNOWN = ("prefix", *LOADED, *CHECKED, *SHOWN)


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def keys_dump() -> list[dict[str, Any]]:
    """Every key, oldest first, as the ``api_keys:`` section lists it (no secret, no digest)."""
    rows = []
    for key in ApiKey.objects.select_related("tenant", "replaced_by").order_by("created_at", "pk"):
        row: dict[str, Any] = {"prefix": key.prefix, "tenant": key.tenant.slug}
        if key.label:
            row["label"] = key.label
        row["class"] = key.default_class
        if key.created_by:
            row["created_by"] = key.created_by
        row["expires_at"] = _when(key.expires_at)
        row["revoked"] = key.revoked_at is not None
        if key.replaced_by is not None:
            row["replaced_by"] = key.replaced_by.prefix
        row["state"] = key.state
        rows.append(row)
    return rows


@dataclass(frozen=True)
class KeyChange:
    key: ApiKey
    expires_at: datetime | None
    revoke: bool


def _expiry(prefix: str, raw: object) -> datetime | None:
    if raw is None:
        return None
    if isinstance(raw, datetime):
        when = raw
    elif isinstance(raw, date) or not isinstance(raw, str):
        raise ValidationError(f"api_keys {prefix}: expires_at is a date-time with its zone, e.g. 2027-01-31T18:00:00Z")
    else:
        try:
            when = datetime.fromisoformat(raw)
        except ValueError:
            raise ValidationError(f"api_keys {prefix}: expires_at {raw!r} is not an ISO 8601 date-time") from None
    if timezone.is_naive(when):
        raise ValidationError(f"api_keys {prefix}: expires_at needs its time zone (e.g. Z or +01:00)")
    return when


def keys_parse(section: object) -> list[KeyChange]:
    """The changes ``section`` (the file's ``api_keys:`` list) asks for; ValidationError naming
    the first entry refused (nothing is changed then)."""
    if not isinstance(section, list):
        raise ValidationError("api_keys must be a list of keys, each with its prefix")
    keys = ApiKey.objects.select_related("tenant", "replaced_by").in_bulk(
        [e["prefix"] for e in section if isinstance(e, dict) and isinstance(e.get("prefix"), str)], field_name="prefix"
    )
    changes, seen = [], set()
    for entry in section:
        if not isinstance(entry, dict) or not isinstance(entry.get("prefix"), str):
            raise ValidationError(f"api_keys: each entry names its key's prefix as text (quoted), not {entry!r}")
        prefix = entry["prefix"]
        unknown = sorted(set(entry) - set(KNOWN))
        if unknown:
            raise ValidationError(f"api_keys {prefix}: unknown field {', '.join(unknown)} (known: {', '.join(KNOWN)})")
        if prefix in seen:
            raise ValidationError(f"api_keys {prefix}: listed twice")
        seen.add(prefix)
        key = keys.get(prefix)
        if key is None:
            raise ValidationError(
                f"api_keys {prefix}: no API key has this prefix. A file never creates keys (their secrets are "
                "shown once): create it with `manage.py apikey create` or on the console"
            )
        if "tenant" in entry and entry["tenant"] != key.tenant.slug:
            raise ValidationError(f"api_keys {prefix}: the key belongs to {key.tenant.slug!r}; a file cannot move it")
        replaced = key.replaced_by.prefix if key.replaced_by else None
        if entry.get("replaced_by") != replaced:
            raise ValidationError(
                f"api_keys {prefix}: the key was rotated to {replaced!r} since this file was written; dump again"
                if replaced
                else f"api_keys {prefix}: replaced_by is set by a rotation (`manage.py apikey rotate`), not by a file"
            )
        revoke = entry.get("revoked", key.revoked_at is not None)
        if not isinstance(revoke, bool):
            raise ValidationError(f"api_keys {prefix}: revoked is true or false")
        if key.revoked_at is not None and not revoke:
            raise ValidationError(f"api_keys {prefix}: a revoked key stays revoked; create a new one")
        expires_at = _expiry(prefix, entry["expires_at"]) if "expires_at" in entry else key.expires_at
        if expires_at != key.expires_at and expires_at is not None and expires_at <= timezone.now():
            raise ValidationError(f"api_keys {prefix}: a new expiry must be in the future (to stop it now: revoked)")
        changes.append(KeyChange(key, expires_at, revoke and key.revoked_at is None))
    return changes


def keys_apply(changes: list[KeyChange], *, actor: str) -> list[str]:
    """Applies `keys_parse`'s changes (in the caller's transaction), each audited; what changed."""
    done = []
    for change in changes:
        key = change.key
        if change.expires_at != key.expires_at:
            old, key.expires_at = key.expires_at, change.expires_at
            key.save(update_fields=["expires_at"])
            audit_record(
                actor=actor,
                action="update",
                entity="apikey",
                key=key.prefix,
                field_name="expires_at",
                old=_when(old),
                new=_when(key.expires_at),
            )
            done.append(f"apikey {key.prefix}: expires_at {_when(old)} -> {_when(key.expires_at)}")
        if change.revoke:
            apikey_revoke(prefix=key.prefix, actor=actor)
            done.append(f"apikey {key.prefix}: revoked")
    return done
