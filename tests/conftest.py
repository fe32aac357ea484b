"""Shared fixtures. Service-bound tests carry @pytest.mark.postgres / @pytest.mark.redis: without the
service they skip and say why; with FAIRGATE_REQUIRE_SERVICES=1 (CI) they fail instead."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest

from simbackend import SimConfig, start_in_thread

REQUIRE_SERVICES = os.environ.get("FAIRGATE_REQUIRE_SERVICES", "") in {"1", "true", "yes", "on"}


@pytest.fixture(autouse=True, scope="session")
def shared_scheduler_world():
    """With REDIS_URL the shared scheduler is the default: the dispatchers this process makes get
    Redis keys of their own (no state of another run or of production), removed at the end with
    those of the gateways the live tests started (tests.support.livestack names them)."""
    from django.conf import settings

    settings.FAIRGATE_SHARED_PREFIX = f"fairgate:test:session:{os.getpid()}:{os.urandom(3).hex()}"
    yield
    url = os.environ.get("REDIS_URL")
    if not url:
        return
    import redis

    try:
        client = redis.Redis.from_url(url)
        for pattern in (f"{settings.FAIRGATE_SHARED_PREFIX}:*", f"fairgate:test:*:{os.getpid()}:*"):
            names = list(client.scan_iter(match=pattern, count=1000))
            if names:
                client.delete(*names)
        client.close()
    except redis.RedisError:  # Redis gone at the end: its keys stay, harmless
        pass


@pytest.fixture(autouse=True, scope="session")
def fast_password_hashing():
    """Tests make many users: with Django's default hasher each password costs about a second
    here. (Servers the live tests start keep the default.)"""
    from django.conf import settings
    from django.contrib.auth import hashers

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()


def _postgres_missing() -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return "DATABASE_URL does not point at PostgreSQL"
    return None


def _redis_missing() -> str | None:
    url = os.environ.get("REDIS_URL")
    if not url:
        return "REDIS_URL is not set"
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except Exception as exc:  # any failure to reach it means "missing" here
        return f"Redis at {url} is unreachable: {exc}"
    return None


_CHECKS = {"postgres": _postgres_missing, "redis": _redis_missing}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, check in _CHECKS.items():
        if item.get_closest_marker(marker) is None:
            continue
        reason = check()
        if reason is None:
            continue
        if REQUIRE_SERVICES:
            pytest.fail(f"{marker} is required here (FAIRGATE_REQUIRE_SERVICES=1): {reason}", pytrace=False)
        pytest.skip(f"needs {marker}: {reason}")


@pytest.fixture
def start_sim():
    """``start_sim(**SimConfig fields)``: a simulated backend in a thread, stopped (its gate opened
    first, so no request stays held) when the test ends."""
    with ExitStack() as stack:

        def start(**overrides: object):
            sim = start_in_thread(SimConfig(port=0, **overrides))  # type: ignore[arg-type]
            stack.callback(sim.stop)
            stack.callback(sim.gate.open)
            return sim

        yield start
