"""Backends misbehaving or full: upstream 429, failures and circuits, VIP fallback, TPM/RPM."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.live.gateway.conftest import sim_stats
from tests.support.livestack import wait_until

pytestmark = pytest.mark.live
CHAT = [{"role": "user", "content": "hello"}]


def test_upstream_429_puts_the_request_back_and_it_is_served(gw):
    """The gateway believes b-429 has 3 slots; the backend has 1 and answers 429 beyond it."""
    sim = gw.extra["sims"]["r429"]
    before = gw.metric("fairgate_upstream_errors_total", backend="b-429", kind="429")
    client = gw.sdk("beta_batch")
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(
            pool.map(
                lambda n: client.chat.completions.with_raw_response.create(
                    model="m-429", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": f"r429-{n}"}
                ),
                range(3),
            )
        )
    assert all(r.parse().choices for r in results)
    stats = sim_stats(sim)
    assert stats["rejected_429"] >= 1 and stats["completed"] == 3
    assert gw.metric("fairgate_upstream_errors_total", backend="b-429", kind="429") == before + stats["rejected_429"]
    # a request put back after a 429 reports its whole wait
    assert max(int(r.headers["x-queue-wait-ms"]) for r in results) > 0


def test_failing_backend_gives_502_then_opens_its_circuit(gw):
    sim = gw.extra["sims"]["fail"]
    client = gw.sdk("alpha")
    for _ in range(2):  # 2 attempts (FAIRGATE_UPSTREAM_RETRIES=1), then 1: the 3rd failure opens the circuit
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model="m-fail", messages=CHAT, max_tokens=1)
        assert err.value.status_code == 502 and err.value.code == "upstream_error"
    attempts = sim_stats(sim)["requests"]
    assert attempts == 3
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m-fail", messages=CHAT, max_tokens=1)
    assert err.value.status_code == 503 and err.value.code == "no_backend"
    assert sim_stats(sim)["requests"] == attempts  # the open circuit kept it away from the backend
    assert gw.metric("fairgate_backend_circuit_open", backend="b-fail") == 1
    time.sleep(1.6)  # cool-down (FAIRGATE_CIRCUIT_COOLDOWN_MS=1500): half-open, one more try
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m-fail", messages=CHAT, max_tokens=1)
    assert err.value.status_code == 502
    assert sim_stats(sim)["requests"] == attempts + 1  # half-open: the first failure re-opened it


def test_unreachable_backend_is_502_upstream_error(gw):
    with pytest.raises(openai.InternalServerError) as err:
        gw.sdk("beta").chat.completions.create(model="m-down", messages=CHAT, max_tokens=1)
    assert err.value.status_code == 502 and err.value.code == "upstream_error"
    assert gw.http("beta").get("/v1/queue").json()["data"] == []  # nothing left running


def test_vip_tenant_uses_the_fallback_when_the_primary_is_full(gw):
    primary, fallback = gw.extra["sims"]["vipmain"], gw.extra["sims"]["vipfb"]
    client_beta = gw.sdk("beta_batch")
    busy = threading.Thread(
        target=lambda: client_beta.chat.completions.create(
            model="m-vip", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "vip-busy"}
        )
    )
    busy.start()
    with gw.http("beta_batch") as http:
        wait_until(lambda: http.get("/v1/queue/vip-busy").json().get("state") == "running", what="primary busy")
    # alpha is VIP: served at once by the fallback while the primary is busy
    gw.sdk("alpha_batch").chat.completions.create(
        model="m-vip", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "vip-alpha"}
    )
    assert sim_stats(fallback, request_id="vip-alpha")["seen"] is True
    # beta is not: it waits for the primary
    waiting = threading.Thread(
        target=lambda: client_beta.chat.completions.create(
            model="m-vip", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "vip-beta"}
        )
    )
    waiting.start()
    with gw.http("beta_batch") as http:
        assert wait_until(lambda: http.get("/v1/queue/vip-beta").json().get("state"), what="admitted") == "queued"
        assert http.get("/v1/queue/vip-busy").json()["state"] == "running"
    busy.join()
    waiting.join()
    assert sim_stats(primary, request_id="vip-beta")["seen"] is True
    assert sim_stats(fallback, request_id="vip-beta")["seen"] is False


def test_rpm_limit_holds_requests_beyond_it(gw):
    client = gw.sdk("beta")
    for _ in range(2):
        client.chat.completions.create(model="m-rpm", messages=CHAT, max_tokens=1)
    with pytest.raises(openai.InternalServerError) as err:  # the 60 s window is full: it waits, then times out
        client.chat.completions.create(
            model="m-rpm",
            messages=CHAT,
            max_tokens=1,
            extra_headers={"X-Request-Timeout-Ms": "300", "X-Request-Id": "rpm-3"},
        )
    assert err.value.status_code == 504 and err.value.code == "queue_timeout"
    assert sim_stats(gw.extra["sims"]["rpm"])["requests"] == 2


def test_tpm_limit_holds_requests_beyond_it(gw):
    client = gw.sdk("beta")
    first = client.chat.completions.create(model="m-tpm", messages=CHAT, max_tokens=100)
    assert first.usage.total_tokens > 100  # estimate and actual both exceed half of the 150 TPM
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(
            model="m-tpm", messages=CHAT, max_tokens=100, extra_headers={"X-Request-Timeout-Ms": "300"}
        )
    assert err.value.code == "queue_timeout"
    small = client.chat.completions.create(model="m-tpm", messages=CHAT, max_tokens=5)  # still fits the window
    assert small.usage.completion_tokens == 5
    assert sim_stats(gw.extra["sims"]["tpm"])["requests"] == 2
