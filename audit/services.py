"""Writes and reads of the audit log, for every app that audits a change."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import models

from audit.models import AuditLog


def audit_record(
    *, actor: str, action: str, entity: str, key: str, field_name: str = "", old: Any = None, new: Any = None
) -> AuditLog:
    return AuditLog.objects.create(
        actor=actor, action=action, entity=entity, key=key, field=field_name, old=jsonable(old), new=jsonable(new)
    )


def jsonable(value: Any) -> Any:
    """A value as an audit row stores it: decimals and rows as text, containers element by element."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, models.Model):
        return str(value)
    return value
