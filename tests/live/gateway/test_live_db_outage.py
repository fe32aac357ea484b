"""A PostgreSQL outage seen by a live gateway: while its database is unreachable, requests get
503 service_unavailable with Retry-After (not 500) wherever the database is needed (the key
lookup, the billing hold in the billing worker), /readyz is 503 and /healthz stays 200; once the
database is back, requests are served again by the same process, without a restart.

The shared PostgreSQL server is never stopped: the gateway reaches its database through a
`PgProxy` that the test cuts (every connection reset) and restores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support import livestack
from tests.support.livestack import Gateway, start_gateway
from tests.support.pgproxy import PgProxy
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = [pytest.mark.live, pytest.mark.postgres]


# "warm" is used before the outage (its key stays cached: the hold is the first thing to need the
# database); "fresh" is first used during it (its lookup needs the database).
KEYS = {"warm": ("acme", "INTERACTIVE"), "fresh": ("acme", "INTERACTIVE")}
# Longer than billing's cache life (billing.cache.CACHE_TTL_S, 1 s): the billing worker has nothing
# left to reload, and its database connection sits idle when the outage breaks it.
QUIET_S = 1.5
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Are you there?"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def through_proxy(tmp_path_factory) -> Iterator[tuple[Gateway, PgProxy]]:
    """A gateway whose every database connection goes through a PgProxy (setup included)."""
    sim = start_in_thread(SimConfig(port=0, slots=4, ttft_ms=2, tokens_per_s=5000, seed=5))
    proxy = PgProxy.for_url(os.environ["DATABASE_URL"]).start()
    direct = livestack._postgres_database
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(livestack, "_postgres_database", lambda var_dir: proxy.url_through(direct(var_dir)))
            gateway = start_gateway(
                tmp_path_factory.mktemp("gw-outage"),
                scheduler_yaml(tenants=[tenant("acme", share=0.5)], backends=[backend("b", f"{sim.url}/v1", slots=4)]),
                KEYS,
                FAIRGATE_AUTH_CACHE_MS="600000",
            )
        yield gateway, proxy
        proxy.restore()  # the test database is dropped through the proxy
        gateway.stop()
    finally:
        proxy.stop()
        sim.stop()


def chat(gateway: Gateway, key: str) -> httpx.Response:
    with gateway.http(key) as client:
        return client.post("/v1/chat/completions", json=CHAT)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "service_unavailable"
    assert error["message"]
    assert int(response.headers["Retry-After"]) >= 1


def assert_served(gateway: Gateway, key: str) -> None:
    response = chat(gateway, key)
    assert response.status_code == 200, response.text
    assert response.json()["choices"]


def test_key_lookup_during_an_outage_is_503_and_the_same_process_recovers(through_proxy):
    gateway, proxy = through_proxy
    pid = gateway.process.pid
    assert_served(gateway, "warm")
    time.sleep(QUIET_S)
    with proxy.outage():
        assert_unavailable(chat(gateway, "fresh"))
        with gateway.http("fresh") as client:
            assert_unavailable(client.get("/v1/models"))
        ready = httpx.get(f"{gateway.url}/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["database"] is False
        assert httpx.get(f"{gateway.url}/healthz").status_code == 200  # alive, only not ready
    assert_served(gateway, "fresh")  # the first hold after the outage: the worker's broken connection was replaced
    assert_served(gateway, "warm")
    assert httpx.get(f"{gateway.url}/readyz").status_code == 200
    assert gateway.process.poll() is None and gateway.process.pid == pid
    assert "internal_error" not in gateway.log()


def test_billing_hold_during_an_outage_is_503_and_the_same_process_recovers(through_proxy):
    gateway, proxy = through_proxy
    pid = gateway.process.pid
    assert_served(gateway, "warm")  # from now on its key is known without the database
    with proxy.outage():
        assert_unavailable(chat(gateway, "warm"))  # refused by the billing worker's hold
        assert_unavailable(chat(gateway, "warm"))
    assert_served(gateway, "warm")
    assert gateway.process.poll() is None and gateway.process.pid == pid
    assert "internal_error" not in gateway.log()
