"""Waiting: classes and downgrades, cancellation, client patience, queue visibility, fairness."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.live.gateway.conftest import sim_stats
from tests.support.livestack import wait_until

pytestmark = pytest.mark.live
CHAT = [{"role": "user", "content": "hello"}]


def _occupy(gw, key: str, model: str, request_id: str) -> threading.Thread:
    """Start a request that holds the model's only slot; return once it runs."""
    client = gw.sdk(key)
    thread = threading.Thread(
        target=lambda: client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": request_id}
        )
    )
    thread.start()
    with gw.http(key) as http:
        wait_until(lambda: http.get(f"/v1/queue/{request_id}").json().get("state") == "running", what="running")
    return thread


# --- classes and downgrades ------------------------------------------------------------------


def _downgrade_stored(gw, request_id: str) -> str:
    return gw.shell(
        "from gateway.models import DowngradeEvent as E; "
        f"print(list(E.objects.filter(request_id='{request_id}').values_list('tenant__slug','from_class','to_class','rule')))"
    ).strip()


def test_long_prompt_is_downgraded_and_the_event_stored(gw):
    prompt = "word " * 8200
    raw = gw.sdk("alpha").chat.completions.with_raw_response.create(
        model="m-main",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=1,
        extra_headers={"X-Request-Id": "long-1"},
    )
    assert raw.headers["x-priority-class"] == "NEAR_RT"
    assert raw.headers["x-priority-downgraded"] == "INTERACTIVE; rule=long-prompt"
    stored = wait_until(lambda: (rows := _downgrade_stored(gw, "long-1")) != "[]" and rows, what="event stored")
    assert stored == "[('alpha', 'INTERACTIVE', 'NEAR_RT', 'long-prompt')]"


def test_short_prompt_keeps_its_class(gw):
    raw = gw.sdk("alpha").chat.completions.with_raw_response.create(model="m-main", messages=CHAT, max_tokens=1)
    assert raw.headers["x-priority-class"] == "INTERACTIVE"
    assert "x-priority-downgraded" not in raw.headers


def test_source_network_downgrade_through_a_trusted_proxy(gw):
    raw = gw.sdk("beta").chat.completions.with_raw_response.create(
        model="m-main", messages=CHAT, max_tokens=1, extra_headers={"X-Forwarded-For": "10.20.3.4"}
    )
    assert raw.headers["x-priority-class"] == "BATCH"
    assert raw.headers["x-priority-downgraded"] == "INTERACTIVE; rule=batch-network"
    outside = gw.sdk("beta").chat.completions.with_raw_response.create(
        model="m-main", messages=CHAT, max_tokens=1, extra_headers={"X-Forwarded-For": "192.168.1.1"}
    )
    assert outside.headers["x-priority-class"] == "INTERACTIVE"


def test_forwarded_for_is_ignored_from_an_untrusted_peer(tight):
    raw = tight.sdk("beta").chat.completions.with_raw_response.create(
        model="m-one", messages=CHAT, max_tokens=1, extra_headers={"X-Forwarded-For": "10.20.3.4"}
    )
    assert raw.headers["x-priority-class"] == "INTERACTIVE"


def test_undeclared_class_is_lowered_to_the_best_allowed(gw):
    raw = gw.sdk("gamma").chat.completions.with_raw_response.create(
        model="m-main", messages=CHAT, max_tokens=1, extra_headers={"X-Priority-Class": "INTERACTIVE"}
    )
    assert raw.headers["x-priority-class"] == "BATCH"
    assert raw.headers["x-priority-downgraded"] == "INTERACTIVE; rule=undeclared"


def test_header_class_overrides_the_key_class(gw):
    raw = gw.sdk("alpha").chat.completions.with_raw_response.create(
        model="m-main", messages=CHAT, max_tokens=1, extra_headers={"X-Priority-Class": "RETRY"}
    )
    assert raw.headers["x-priority-class"] == "RETRY"


# --- cancellation and patience ---------------------------------------------------------------


def test_client_that_disconnects_while_waiting_is_never_sent_upstream(gw):
    sim = gw.extra["sims"]["slow"]
    blocker = _occupy(gw, "beta", "m-slow", "block-cancel")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gw.url}/v1/chat/completions",
            timeout=0.25,
            headers={"Authorization": f"Bearer {gw.keys['beta']}", "X-Request-Id": "cancel-me"},
            json={"model": "m-slow", "messages": CHAT, "max_tokens": 1},
        )
    with gw.http("beta") as http:
        state = wait_until(lambda: http.get("/v1/queue/cancel-me").json().get("state") == "cancelled", what="cancel")
        assert state
    blocker.join()
    gw.sdk("beta").chat.completions.create(model="m-slow", messages=CHAT, max_tokens=1)  # the slot is free again
    assert sim_stats(sim, request_id="cancel-me")["seen"] is False
    assert sim_stats(sim, request_id="block-cancel")["seen"] is True


def test_client_that_disconnects_mid_stream_frees_the_slot(gw):
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/chat/completions",
        timeout=10,
        headers={"Authorization": f"Bearer {gw.keys['beta']}", "X-Request-Id": "stream-gone"},
        json={"model": "m-fair", "messages": CHAT, "max_tokens": 400, "stream": True},
    ) as response:
        assert response.status_code == 200
        next(response.iter_bytes())
    with gw.http("beta") as http:
        record = wait_until(
            lambda: (r := http.get("/v1/queue/stream-gone").json()).get("state") == "cancelled" and r, what="stream end"
        )
    assert record["backend"] == "b-fair"
    # the only slot of m-fair is free: a new request is served without waiting for the 1 s stream
    gw.sdk("beta").chat.completions.create(model="m-fair", messages=CHAT, max_tokens=1, timeout=5)


def test_client_that_disconnects_while_running_frees_its_slot(gw):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gw.url}/v1/chat/completions",
            timeout=0.3,
            headers={"Authorization": f"Bearer {gw.keys['beta']}", "X-Request-Id": "left-running"},
            json={"model": "m-slow", "messages": CHAT, "max_tokens": 1},
        )
    with gw.http("beta") as http:
        record = wait_until(
            lambda: (r := http.get("/v1/queue/left-running").json()).get("state") == "cancelled" and r, what="ended"
        )
        assert record["backend"] == "b-slow"
        assert http.get("/v1/queue").json()["data"] == []
    assert gw.metric("fairgate_backend_slots_in_use", backend="b-slow") == 0
    assert sim_stats(gw.extra["sims"]["slow"], request_id="left-running")["seen"] is True


def test_client_patience_gives_504_queue_timeout_without_sdk_retry(gw):
    blocker = _occupy(gw, "beta", "m-slow", "block-patience")
    before = gw.metric("fairgate_rejects_total", code="queue_timeout")
    client = gw.sdk("beta", max_retries=2)  # the SDK would retry a 5xx, but not with x-should-retry: false
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(
            model="m-slow",
            messages=CHAT,
            max_tokens=1,
            extra_headers={"X-Request-Timeout-Ms": "150", "X-Request-Id": "impatient"},
        )
    blocker.join()
    assert err.value.status_code == 504 and err.value.code == "queue_timeout"
    assert err.value.response.headers["x-should-retry"] == "false"
    assert gw.metric("fairgate_rejects_total", code="queue_timeout") == before + 1
    assert gw.http("beta").get("/v1/queue/impatient").json()["state"] == "queue_timeout"
    assert sim_stats(gw.extra["sims"]["slow"], request_id="impatient")["seen"] is False


def test_queue_full_is_429_with_retry_after(tight):
    client = tight.sdk("beta")
    running = threading.Thread(
        target=lambda: client.chat.completions.create(model="m-one", messages=CHAT, max_tokens=1)
    )
    running.start()
    with tight.http("beta") as http:
        wait_until(lambda: [i["state"] for i in http.get("/v1/queue").json()["data"]] == ["running"], what="running")
    waiting = threading.Thread(
        target=lambda: client.chat.completions.create(
            model="m-one", messages=CHAT, max_tokens=1, extra_headers={"X-Priority-Class": "NEAR_RT"}
        )
    )
    waiting.start()
    with tight.http("beta") as http:
        wait_until(lambda: len(http.get("/v1/queue").json()["data"]) == 2, what="one waiting")
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(
            model="m-one", messages=CHAT, max_tokens=1, extra_headers={"X-Priority-Class": "NEAR_RT"}
        )
    running.join()
    waiting.join()
    assert err.value.status_code == 429 and err.value.code == "queue_full"
    assert int(err.value.response.headers["retry-after"]) >= 1


# --- queue visibility ------------------------------------------------------------------------


def test_position_and_eta_move_as_requests_ahead_complete(gw):
    client = gw.sdk("alpha_batch")
    # one served first, so the ETAs come from a measured service time from the start (on a model
    # with no history the engine assumes its prior, then measures: the ETA would jump once)
    client.chat.completions.create(model="m-slow", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "pos-w"})
    ids = [f"pos-{i}" for i in range(4)]
    threads = []
    with gw.http("alpha_batch") as http:
        for request_id in ids:
            threads.append(
                threading.Thread(
                    target=lambda rid=request_id: client.chat.completions.create(
                        model="m-slow", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": rid}
                    )
                )
            )
            threads[-1].start()
            wait_until(lambda rid=request_id: http.get(f"/v1/queue/{rid}").status_code == 200, what="admitted")
        seen, promises = [], []
        while True:
            item = http.get("/v1/queue/pos-3").json()
            if item["state"] != "queued":
                break
            promises.append(item)
            if not seen or seen[-1][0] != item["position"]:
                seen.append((item["position"], item["eta_ms"]))
            time.sleep(0.03)
        listing = http.get("/v1/queue").json()["data"]
    for thread in threads:
        thread.join()
    positions = [p for p, _ in seen]
    assert positions[0] == 3 and positions == sorted(positions, reverse=True) and len(set(positions)) >= 2, seen
    etas = [e for _, e in seen]
    assert etas == sorted(etas, reverse=True) and etas[0] > etas[-1], seen
    assert all(i["model"] == "m-slow" and i["class"] == "BATCH" for i in listing)
    assert gw.http("alpha_batch").get("/v1/queue/pos-3").json()["state"] == "completed"
    # the ETA as a promise: a bound within twice the point, measured (pos-w completed first), the
    # first expected start kept (epoch ms) and no slip while requests ahead only complete
    assert promises and all(p["eta_ms"] <= p["eta_upper_ms"] <= 2 * p["eta_ms"] for p in promises), promises
    assert {p["eta_confidence"] for p in promises} == {"measured"}, promises
    assert len({p["eta_first_at_ms"] for p in promises}) == 1, promises
    assert abs(promises[0]["eta_first_at_ms"] - time.time() * 1000) < 600_000, promises[0]
    assert all(p["eta_slip_reason"] is None for p in promises), promises
    assert all(key in i for i in listing for key in ("eta_upper_ms", "eta_confidence", "eta_slip_reason"))


def test_queue_entries_are_private_to_their_tenant(gw):
    gw.sdk("alpha").chat.completions.create(
        model="m-main", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "mine-only"}
    )
    assert gw.http("alpha").get("/v1/queue/mine-only").json()["state"] == "completed"
    response = gw.http("beta").get("/v1/queue/mine-only")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert gw.http().get("/v1/queue").status_code == 401


# --- fairness --------------------------------------------------------------------------------


def test_two_tenants_are_served_in_proportion_to_their_weights(gw):
    """heavy (0.6) and light (0.2) flood one slot; while both wait, heavy gets about 3 of 4 turns."""
    sim = gw.extra["sims"]["fair"]
    clients = {key: gw.sdk(key) for key in ("blocker", "heavy", "light")}
    hold = threading.Thread(
        target=lambda: clients["blocker"].chat.completions.create(
            model="m-fair", messages=CHAT, max_tokens=1200, extra_headers={"X-Request-Id": "fair-blocker"}
        )
    )
    hold.start()
    with gw.http("blocker") as http:
        wait_until(lambda: http.get("/v1/queue/fair-blocker").json().get("state") == "running", what="blocker runs")

    def send(key: str, n: int):
        return clients[key].chat.completions.create(
            model="m-fair", messages=CHAT, max_tokens=2, extra_headers={"X-Request-Id": f"{key}-{n}"}
        )

    jobs = [("heavy", n) for n in range(24)] + [("light", n) for n in range(24)]
    with ThreadPoolExecutor(max_workers=48) as pool:
        futures = [pool.submit(send, key, n) for key, n in jobs]
        with gw.http("heavy") as http:
            wait_until(lambda: len(http.get("/v1/queue").json()["data"]) == 24, what="heavy queued")
        with gw.http("light") as http:
            wait_until(lambda: len(http.get("/v1/queue").json()["data"]) == 24, what="light queued")
        with gw.http("blocker") as http:
            assert http.get("/v1/queue/fair-blocker").json()["state"] == "running"  # all 48 queued behind it
        for future in futures:
            future.result()
    hold.join()
    order = [rid for rid in sim_stats(sim)["recent_request_ids"] if rid.startswith(("heavy-", "light-"))]
    first = order[:24]
    heavy = sum(1 for rid in first if rid.startswith("heavy-"))
    assert 15 <= heavy <= 21, order  # 3:1 → 18 of the first 24
