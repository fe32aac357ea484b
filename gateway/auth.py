"""`Authorization: Bearer <key>` → the calling tenant.

The key's prefix finds the row; the full key is checked against the stored SHA-256 digest in
constant time. Lookups are cached for at most ``FAIRGATE_AUTH_CACHE_MS`` (1 s by default), so a
revoked key or a deactivated tenant stops working within that time, and a key created later is
found within it. A made-up key costs no query: the prefixes of all usable keys are held as one
set (read with the lookups, as old as they may be), and a prefix outside it is refused at once.
Known keys and unknown prefixes are cached apart (a flood of made-up keys never evicts a valid
key), and lookups go to the database in batches, known keys' refreshes first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from gateway.connlimit import key_accepted
from gateway.db import db_call
from gateway.errors import ErrorCode, GatewayError
from scheduling.selectors import tenant_spec
from tenants.keys import key_matches, key_prefix
from tenants.models import ApiKey

log = logging.getLogger(__name__)
HITS_MAX = 10_000  # valid keys cached (only keys that exist get here)
MISSES_MAX = 50_000  # unknown prefixes remembered, the oldest forgotten first
LOAD_BATCH = 500  # prefixes looked up in one query
USABLE_MAX = 20_000  # more usable keys than this: no set of their prefixes, each unknown one is looked up
LAST_USED_S = 60.0  # a key's "last used" is written at most this often (one UPDATE for all keys used)


@dataclass(frozen=True)
class Caller:
    tenant: str
    tenant_id: int
    vip: bool
    allowed_classes: tuple[str, ...]
    default_class: str
    key_prefix: str
    key_creator: str = ""  # tenants.ApiKey.created_by: its requests' ledger entries record it


@dataclass(frozen=True)
class _KeyRow:
    secret_hash: str
    caller: Caller
    expires_at_s: float | None = None  # wall clock (time.time()); refused from then on, cache or not

    def expired(self) -> bool:
        return self.expires_at_s is not None and self.expires_at_s <= time.time()


_hits: dict[str, tuple[_KeyRow, float]] = {}  # prefix → (row, expiry in monotonic s), oldest first
_misses: OrderedDict[str, float] = OrderedDict()  # unknown prefix → expiry, oldest first
_usable: tuple[frozenset[str] | None, float] = (None, 0.0)  # every usable key's prefix, and its expiry


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, ErrorCode.INVALID_API_KEY, message)


def _row(key: ApiKey) -> _KeyRow:
    spec = tenant_spec(key.tenant)
    caller = Caller(
        tenant=key.tenant.slug,
        tenant_id=key.tenant.pk,
        vip=spec.vip,
        allowed_classes=spec.classes,
        default_class=key.default_class,
        key_prefix=key.prefix,
        key_creator=key.created_by,
    )
    return _KeyRow(key.secret_hash, caller, key.expires_at.timestamp() if key.expires_at else None)


def _load_many(prefixes: list[str]) -> dict[str, _KeyRow]:
    """The keys among ``prefixes`` not revoked, of an active tenant, by prefix (one query); an
    expired one is refused by its row (`_KeyRow.expired`), with a message saying so."""
    keys = ApiKey.objects.select_related("tenant").filter(
        prefix__in=prefixes, revoked_at__isnull=True, tenant__active=True
    )
    return {key.prefix: _row(key) for key in keys}


def _usable_prefixes() -> frozenset[str] | None:
    """The prefixes of every usable key (not revoked, tenant active); None past USABLE_MAX."""
    usable = ApiKey.objects.filter(revoked_at__isnull=True, tenant__active=True)
    prefixes = list(usable.values_list("prefix", flat=True)[: USABLE_MAX + 1])
    return None if len(prefixes) > USABLE_MAX else frozenset(prefixes)


def _load(prefixes: list[str], *, usable_too: bool) -> tuple[dict[str, _KeyRow], frozenset[str] | None]:
    """`_load_many`, and `_usable_prefixes` if ``usable_too`` (else None): one trip to the database."""
    return _load_many(prefixes), _usable_prefixes() if usable_too else None


def _remember(prefix: str, row: _KeyRow | None, expires_s: float) -> None:
    _hits.pop(prefix, None)  # re-inserted last: the dict's order is its age
    _misses.pop(prefix, None)
    if row is not None:
        if len(_hits) >= HITS_MAX:
            del _hits[next(iter(_hits))]
        _hits[prefix] = (row, expires_s)
    else:
        if len(_misses) >= MISSES_MAX:
            _misses.popitem(last=False)
        _misses[prefix] = expires_s


@dataclass
class _Loader:
    """The lookups waiting for the database in one event loop, sent in batches of LOAD_BATCH by one
    task: refreshes of known keys first, then unknown prefixes. A prefix asked for again while it
    waits or loads shares that lookup."""

    loop: asyncio.AbstractEventLoop
    known: dict[str, asyncio.Future] = field(default_factory=dict)
    unknown: dict[str, asyncio.Future] = field(default_factory=dict)
    loading: dict[str, asyncio.Future] = field(default_factory=dict)
    task: asyncio.Task | None = None

    def future(self, prefix: str) -> asyncio.Future:
        found = self.loading.get(prefix) or self.known.get(prefix) or self.unknown.get(prefix)
        if found is not None:
            return found
        waiting = self.known if prefix in _hits else self.unknown
        found = waiting[prefix] = self.loop.create_future()
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run())
        return found

    def _take(self) -> dict[str, asyncio.Future]:
        batch: dict[str, asyncio.Future] = {}
        for waiting in (self.known, self.unknown):
            while waiting and len(batch) < LOAD_BATCH:
                prefix = next(iter(waiting))
                batch[prefix] = waiting.pop(prefix)
        return batch

    async def _run(self) -> None:
        global _usable
        while self.known or self.unknown:
            self.loading = self._take()
            started_s = time.monotonic()
            usable_too = _usable[1] <= started_s
            try:
                rows, usable = await db_call(_load)(list(self.loading), usable_too=usable_too)
            except Exception as exc:  # an outage: each lookup of this batch raises it
                for waiting in self.loading.values():
                    if not waiting.done():
                        waiting.set_exception(exc)
                        waiting.exception()  # retrieved: a request that left meanwhile does not log it
                continue
            finally:
                batch, self.loading = self.loading, {}
            expires_s = started_s + settings.FAIRGATE_AUTH_CACHE_MS / 1000
            if usable_too:
                _usable = (usable, expires_s)
            for prefix, waiting in batch.items():
                _remember(prefix, rows.get(prefix), expires_s)
                if not waiting.done():
                    waiting.set_result(rows.get(prefix))


_loader: _Loader | None = None


async def _lookup(prefix: str) -> _KeyRow | None:
    global _loader
    now_s = time.monotonic()
    hit = _hits.get(prefix)
    if hit is not None and hit[1] > now_s:
        return hit[0]
    missed_until_s = _misses.get(prefix)
    if missed_until_s is not None and missed_until_s > now_s:
        return None
    usable, usable_until_s = _usable
    if hit is None and usable is not None and usable_until_s > now_s and prefix not in usable:
        return None  # no usable key has it (a key created since is found once the set expires)
    loop = asyncio.get_running_loop()
    if _loader is None or _loader.loop is not loop:
        _loader = _Loader(loop)
    return await asyncio.shield(_loader.future(prefix))


async def caller_of(prefix: str) -> Caller | None:
    """The caller a key's prefix names (for work done later in its name: a batch's lines); None
    once the key is revoked or expired, or its tenant inactive."""
    row = await _lookup(prefix)
    return None if row is None or row.expired() else row.caller


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def refused_from_cache(authorization: str | None) -> bool:
    """Whether a key is sure to be refused from what is cached, without a lookup or an await: none,
    malformed, a prefix cached as unknown, or one outside the fresh set of usable prefixes (for
    `serve`'s protocol, which limits the client's address before the request reaches the app)."""
    token = bearer_token(authorization)
    prefix = key_prefix(token) if token else None
    if prefix is None:
        return True
    if prefix in _hits:
        return False
    now_s = time.monotonic()
    missed_until_s = _misses.get(prefix)
    if missed_until_s is not None and missed_until_s > now_s:
        return True
    usable, usable_until_s = _usable
    return usable is not None and usable_until_s > now_s and prefix not in usable


async def authenticate(authorization: str | None) -> Caller:
    """The caller of a request, or ``GatewayError(401 invalid_api_key)``. A key that is not cached
    is looked up in the database: while that is down, one of ``gateway.db.DATABASE_UNAVAILABLE``
    is raised (503 service_unavailable), never a 401."""
    token = bearer_token(authorization)
    if token is None:
        raise _unauthorized("Missing API key: send 'Authorization: Bearer <your Fairgate key>'.")
    prefix = key_prefix(token)
    row = await _lookup(prefix) if prefix else None
    if prefix is None or row is None or not key_matches(token, row.secret_hash):
        raise _unauthorized("Invalid API key: it is unknown or has been revoked. Ask your admin for a key.")
    if row.expired():
        raise _unauthorized("This API key has expired. Ask your admin for a new one (or use the key that replaced it).")
    _used(prefix)
    key_accepted()  # its client's address is not limited (gateway.connlimit)
    return row.caller


_used_prefixes: set[str] = set()  # keys that authenticated since the last write of "last used"
_used_flush: asyncio.TimerHandle | None = None


def _used(prefix: str) -> None:
    """Notes a key's use; "last used" is written for all noted keys at most every LAST_USED_S."""
    global _used_flush
    _used_prefixes.add(prefix)
    if _used_flush is None:
        _used_flush = asyncio.get_running_loop().call_later(LAST_USED_S, _used_write_soon)


def _used_write_soon() -> None:
    global _used_flush
    _used_flush = None
    prefixes = sorted(_used_prefixes)
    _used_prefixes.clear()
    task = asyncio.get_running_loop().create_task(used_write(prefixes))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def used_write(prefixes: list[str]) -> None:
    """One UPDATE for every key used since the last one (a database outage skips a round)."""
    if not prefixes:
        return
    try:
        await db_call(_used_update)(prefixes)
    except Exception as exc:
        log.warning("could not write the keys' last use: %s", exc)


def _used_update(prefixes: list[str]) -> int:
    return ApiKey.objects.filter(prefix__in=prefixes).update(last_used_at=timezone.now())


_tasks: set[asyncio.Task] = set()


def cache_clear() -> None:
    global _loader, _usable, _used_flush
    if _used_flush is not None:
        _used_flush.cancel()
        _used_flush = None
    _used_prefixes.clear()
    _hits.clear()
    _misses.clear()
    _usable = (None, 0.0)
    _loader = None
