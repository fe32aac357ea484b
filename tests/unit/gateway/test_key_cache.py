"""The key cache against a flood of made-up keys, on the real database: unknown prefixes are
refused by the set of usable prefixes or cached as misses apart from the valid keys, so a valid
key stays served from the cache (its prefix never looked up again) however many random keys
come; misses expire, so a key created later is found; a revoked key stops working once its entry
expires, as before."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from gateway import auth
from gateway.errors import GatewayError
from tenants.keys import key_generate
from tenants.models import ApiKey, Tenant

pytestmark = pytest.mark.django_db(transaction=True)  # gateway.db.db_call recycles the connection

FLOOD_KEYS = 100_000
WAVE = 2_000  # random keys in flight at once
SECRET = "s" * 43


class _CountedKeys:
    """``ApiKey`` as gateway.auth queries it (``objects.select_related(...).filter(...)``), counting the
    prefixes each query asks for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.objects = self

    def select_related(self, *fields: str) -> _CountedKeys:
        return self

    def filter(self, **lookups):
        if "prefix__in" in lookups or "prefix" in lookups:
            self.asked += lookups["prefix__in"] if "prefix__in" in lookups else [lookups["prefix"]]
        return ApiKey.objects.select_related("tenant").filter(**lookups)


@pytest.fixture
def asked(monkeypatch) -> Iterator[Callable[[str], int]]:
    """How many lookups the database got for a prefix."""
    counted = _CountedKeys()
    monkeypatch.setattr(auth, "ApiKey", counted)
    auth.cache_clear()
    yield counted.asked.count
    auth.cache_clear()


def _key(slug: str = "acme") -> tuple[str, ApiKey]:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug, "quota_share": "0.5"})
    full_key, prefix, secret_hash = key_generate()
    return full_key, ApiKey.objects.create(tenant=tenant, default_class="BATCH", prefix=prefix, secret_hash=secret_hash)


def _random_key() -> str:
    return f"fg_{secrets.token_hex(5)}_{SECRET}"


async def _refused(authorization: str) -> bool:
    try:
        await auth.authenticate(authorization)
    except GatewayError as err:
        return err.status == 401
    return False


@pytest.mark.parametrize("usable_max", [100_000, 0], ids=["refused-by-the-usable-set", "cached-as-misses"])
def test_a_flood_of_random_keys_never_evicts_a_valid_key(asked, settings, monkeypatch, usable_max):
    settings.FAIRGATE_AUTH_CACHE_MS = 600_000  # only eviction could send the valid key to the database again
    monkeypatch.setattr(auth, "USABLE_MAX", usable_max)  # 0: no set of usable prefixes, each miss looked up
    full_key, key = _key()

    async def scenario() -> None:
        assert (await auth.authenticate(f"Bearer {full_key}")).tenant == "acme"
        assert asked(key.prefix) == 1
        for _ in range(FLOOD_KEYS // WAVE):
            refused = await asyncio.gather(*(_refused(f"Bearer {_random_key()}") for _ in range(WAVE)))
            assert all(refused)
            assert (await auth.authenticate(f"Bearer {full_key}")).tenant == "acme"
            assert asked(key.prefix) == 1, "the valid key was looked up again: evicted by the flood"
        assert len(auth._misses) <= auth.MISSES_MAX

    async_to_sync(scenario)()


def test_an_unknown_prefix_is_looked_up_at_most_once_while_its_miss_is_cached(asked, settings):
    settings.FAIRGATE_AUTH_CACHE_MS = 600_000
    stranger = _random_key()

    async def scenario() -> None:
        refused = await asyncio.gather(*(_refused(f"Bearer {stranger}") for _ in range(50)))
        refused += [await _refused(f"Bearer {stranger}") for _ in range(50)]
        assert all(refused)

    async_to_sync(scenario)()
    assert asked(stranger.split("_")[1]) <= 1  # none once the usable keys' prefixes are known


def test_a_key_created_after_its_prefix_missed_is_found_once_the_miss_expires(asked, settings):
    settings.FAIRGATE_AUTH_CACHE_MS = 0  # every entry expires at once
    full_key, prefix, secret_hash = key_generate()
    assert async_to_sync(_refused)(f"Bearer {full_key}")
    tenant = Tenant.objects.create(slug="late", name="late", quota_share="0.5")
    ApiKey.objects.create(tenant=tenant, default_class="BATCH", prefix=prefix, secret_hash=secret_hash)
    assert async_to_sync(auth.authenticate)(f"Bearer {full_key}").tenant == "late"


def test_a_revoked_key_stops_working_once_its_entry_expires(asked, settings, monkeypatch):
    settings.FAIRGATE_AUTH_CACHE_MS = 600_000
    full_key, key = _key()
    assert async_to_sync(auth.authenticate)(f"Bearer {full_key}").tenant == "acme"
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    assert async_to_sync(auth.authenticate)(f"Bearer {full_key}").tenant == "acme"  # cached, as before
    later_s = time.monotonic() + 601
    monkeypatch.setattr(auth.time, "monotonic", lambda: later_s)  # its entry has expired
    assert async_to_sync(_refused)(f"Bearer {full_key}")
    assert asked(key.prefix) == 2
