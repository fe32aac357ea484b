"""`Authorization: Bearer <key>` → the calling tenant.

The key's prefix finds the row; the full key is checked against the stored SHA-256 digest in
constant time. Lookups are cached for at most ``FAIRGATE_AUTH_CACHE_MS`` (1 s by default), so a
revoked key or a deactivated tenant stops working within that time.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from django.conf import settings

from gateway.db import db_call
from gateway.errors import ErrorCode, GatewayError
from scheduling.selectors import tenant_spec
from tenants.keys import key_matches, key_prefix
from tenants.models import ApiKey


@dataclass(frozen=True)
class Caller:
    tenant: str
    tenant_id: int
    vip: bool
    allowed_classes: tuple[str, ...]
    default_class: str
    key_prefix: str


@dataclass(frozen=True)
class _KeyRow:
    secret_hash: str
    caller: Caller


_cache: dict[str, tuple[_KeyRow | None, float]] = {}
_inflight: dict[str, asyncio.Task] = {}
_CACHE_MAX = 10_000


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, ErrorCode.INVALID_API_KEY, message)


def _load(prefix: str) -> _KeyRow | None:
    key = (
        ApiKey.objects.select_related("tenant")
        .filter(prefix=prefix, revoked_at__isnull=True, tenant__active=True)
        .first()
    )
    if key is None:
        return None
    tenant = key.tenant
    spec = tenant_spec(tenant)
    caller = Caller(
        tenant=tenant.slug,
        tenant_id=tenant.pk,
        vip=spec.vip,
        allowed_classes=spec.classes,
        default_class=key.default_class,
        key_prefix=prefix,
    )
    return _KeyRow(key.secret_hash, caller)


async def _refresh(prefix: str) -> _KeyRow | None:
    now_s = time.monotonic()
    row = await db_call(_load)(prefix)
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[prefix] = (row, now_s + settings.FAIRGATE_AUTH_CACHE_MS / 1000)
    return row


async def _lookup(prefix: str) -> _KeyRow | None:
    hit = _cache.get(prefix)
    if hit is not None and hit[1] > time.monotonic():
        return hit[0]
    # One database lookup per key at a time: when a busy key's entry expires, the requests that
    # arrive meanwhile wait for that lookup instead of queueing one each on the database thread.
    loop = asyncio.get_running_loop()
    pending = _inflight.get(prefix)
    if pending is None or pending.get_loop() is not loop:
        pending = _inflight[prefix] = loop.create_task(_refresh(prefix))
        pending.add_done_callback(lambda done: _inflight.pop(prefix, None) if _inflight.get(prefix) is done else None)
    return await asyncio.shield(pending)


async def caller_of(prefix: str) -> Caller | None:
    """The caller a key's prefix names (for work done later in its name: a batch's lines); None
    once the key is revoked or its tenant inactive."""
    row = await _lookup(prefix)
    return None if row is None else row.caller


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def authenticate(authorization: str | None) -> Caller:
    """The caller of a request, or ``GatewayError(401 invalid_api_key)``. A key that is not cached
    is looked up in the database: while that is down, one of ``gateway.db.DATABASE_UNAVAILABLE``
    is raised (503 service_unavailable), never a 401."""
    token = bearer_token(authorization)
    if token is None:
        raise _unauthorized("Missing API key: send 'Authorization: Bearer <your Fairgate key>'.")
    prefix = key_prefix(token)
    row = await _lookup(prefix) if prefix else None
    if row is None or not key_matches(token, row.secret_hash):
        raise _unauthorized("Invalid API key: it is unknown or has been revoked. Ask your admin for a key.")
    return row.caller


def cache_clear() -> None:
    _cache.clear()
    _inflight.clear()
