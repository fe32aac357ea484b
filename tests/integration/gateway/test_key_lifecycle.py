"""API keys that expire and rotate, with an injected clock, and a "last used" that is written
coalesced: one UPDATE for many requests, never one per request."""

from __future__ import annotations

import asyncio
import io
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from audit.models import AuditLog
from gateway import auth
from gateway.errors import GatewayError
from tenants.models import ApiKey, Tenant
from tenants.services import apikey_create, apikey_rotate

pytestmark = pytest.mark.django_db(transaction=True)  # gateway.db.db_call recycles the connection
CLASSES = ("INTERACTIVE", "BATCH")


@pytest.fixture(autouse=True)
def fresh_cache():
    auth.cache_clear()
    yield
    auth.cache_clear()


@pytest.fixture
def tenant():
    return Tenant.objects.create(slug="acme", name="Acme", quota_share="0.5")


class Clock:
    """Both clocks the key check reads (the row's expiry against time.time(), the database's
    filter against timezone.now()), moved together."""

    def __init__(self, monkeypatch) -> None:
        self.shift = timedelta(0)
        real_time, real_now = auth.time.time, timezone.now
        monkeypatch.setattr(auth.time, "time", lambda: real_time() + self.shift.total_seconds())
        monkeypatch.setattr(auth.timezone, "now", lambda: real_now() + self.shift)

    def advance(self, by: timedelta) -> None:
        self.shift += by
        auth.cache_clear()  # the expiry holds in the cache too (below); a fresh lookup sees the same


def check(full_key: str) -> str:
    """The caller's tenant, or the 401's message."""
    try:
        return async_to_sync(auth.authenticate)(f"Bearer {full_key}").tenant
    except GatewayError as err:
        return err.message


def create(tenant, **options):
    return apikey_create(tenant_slug=tenant.slug, default_class="BATCH", actor="test", known_classes=CLASSES, **options)


def test_an_expiring_key_works_until_its_expiry_and_not_after(tenant, monkeypatch):
    clock = Clock(monkeypatch)
    _, full = create(tenant, expires_at=timezone.now() + timedelta(days=30))
    assert check(full) == "acme"
    clock.advance(timedelta(days=29, hours=23))
    assert check(full) == "acme"
    clock.advance(timedelta(hours=2))
    assert "expired" in check(full)


def test_an_expired_key_is_refused_even_from_the_cache(tenant, monkeypatch):
    real_time = auth.time.time
    _, full = create(tenant, expires_at=timezone.now() + timedelta(hours=1))
    assert check(full) == "acme"  # cached now, for FAIRGATE_AUTH_CACHE_MS
    monkeypatch.setattr(auth.time, "time", lambda: real_time() + 7200)
    assert "expired" in check(full)


def test_a_rotated_key_keeps_working_for_its_grace_then_stops(tenant, monkeypatch):
    clock = Clock(monkeypatch)
    old, old_full = create(tenant, label="nightly")
    new, new_full = apikey_rotate(prefix=old.prefix, grace=timedelta(hours=24), actor="test")
    old.refresh_from_db()
    assert new.label == "nightly" and new.default_class == "BATCH" and old.replaced_by == new
    assert old.state == "rotated" and new.state == "active"
    assert check(old_full) == check(new_full) == "acme"
    clock.advance(timedelta(hours=23, minutes=59))
    assert check(old_full) == "acme"
    clock.advance(timedelta(minutes=2))
    assert "expired" in check(old_full) and check(new_full) == "acme"
    entry = AuditLog.objects.get(entity="apikey", action="rotate", key=old.prefix)
    assert entry.new["replaced_by"] == new.prefix


def test_rotation_never_extends_a_key_and_refuses_twice(tenant):
    soon = timezone.now() + timedelta(hours=2)
    old, _ = create(tenant, expires_at=soon)
    new, _ = apikey_rotate(prefix=old.prefix, grace=timedelta(hours=24), actor="test")
    old.refresh_from_db()
    assert old.expires_at == soon and new.expires_at == soon
    with pytest.raises(Exception, match="already rotated"):
        apikey_rotate(prefix=old.prefix, grace=timedelta(hours=24), actor="test")


def test_labels_over_200_characters_are_refused_not_cut(tenant):
    with pytest.raises(Exception, match="at most 200 characters"):
        create(tenant, label="x" * 201)
    assert not ApiKey.objects.exists()


def test_last_used_is_written_once_for_many_requests(tenant, monkeypatch):
    key, full = create(tenant)
    other, other_full = create(tenant)
    flushed: list[list[str]] = []
    real_write = auth.used_write

    async def write(prefixes):
        await real_write(prefixes)
        flushed.append(prefixes)

    monkeypatch.setattr(auth, "used_write", write)
    monkeypatch.setattr(auth, "LAST_USED_S", 3600.0)  # the timer is fired by hand below, never by the clock

    async def many() -> None:
        for _ in range(50):
            await auth.authenticate(f"Bearer {full}")
        await auth.authenticate(f"Bearer {other_full}")
        timer = auth._used_flush
        assert timer is not None and flushed == []  # 51 uses, one pending write, none done
        timer.cancel()
        auth._used_write_soon()  # what the timer does when it fires
        await asyncio.gather(*auth._tasks)

    async_to_sync(many)()
    assert flushed == [sorted([key.prefix, other.prefix])]
    key.refresh_from_db()
    other.refresh_from_db()
    assert key.last_used_at is not None and other.last_used_at is not None


def test_the_command_creates_expiring_keys_rotates_and_lists(tenant):
    from scheduling.models import PriorityClass

    PriorityClass.objects.create(name="BATCH", level=2, sla_ms=60000)
    out = io.StringIO()
    call_command("apikey", "create", "acme", "--class", "BATCH", "--expires-days", "7", stdout=out)
    key = ApiKey.objects.get()
    assert key.expires_at is not None and timedelta(days=6) < key.expires_at - timezone.now() <= timedelta(days=7)
    rotated, told = io.StringIO(), io.StringIO()
    call_command("apikey", "rotate", key.prefix, "--grace-hours", "2", stdout=rotated, stderr=told)
    new = ApiKey.objects.exclude(pk=key.pk).get()
    assert rotated.getvalue().strip().startswith(f"fg_{new.prefix}_") and "keeps working until" in told.getvalue()
    listing = io.StringIO()
    call_command("apikey", "list", stdout=listing)
    assert "rotated" in listing.getvalue() and "never" in listing.getvalue()
    with pytest.raises(CommandError) as refused:
        call_command("apikey", "create", "acme", "--class", "BATCH", "--expires-days", "0")
    assert refused.value.returncode == 2
