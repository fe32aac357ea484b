"""The request path over real HTTP with the official openai SDK: completions, streams, errors."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.live.gateway.conftest import sim_stats
from tests.support.livestack import wait_until

pytestmark = pytest.mark.live
CHAT = [{"role": "user", "content": "Say hello to the queue."}]


def test_chat_non_streaming_passes_the_backend_answer_through(gw):
    raw = gw.sdk("alpha").chat.completions.with_raw_response.create(model="m-main", messages=CHAT, max_tokens=5)
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage.completion_tokens == 5
    assert raw.headers["x-priority-class"] == "INTERACTIVE"
    assert raw.headers["x-request-id"].startswith("req_")
    assert int(raw.headers["x-queue-wait-ms"]) >= 0
    assert "x-priority-downgraded" not in raw.headers
    assert not [name for name in raw.headers if name.startswith("x-sim-")]  # the backend's own headers stay behind


def test_text_completion_non_streaming(gw):
    completion = gw.sdk("beta").completions.create(model="m-main", prompt="Once upon a time", max_tokens=4)
    assert completion.choices[0].text
    assert completion.usage.prompt_tokens > 0


def test_chat_stream_drops_the_usage_chunk_the_client_did_not_ask_for(gw):
    chunks = list(gw.sdk("alpha").chat.completions.create(model="m-main", messages=CHAT, max_tokens=6, stream=True))
    assert chunks and all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_keeps_usage_when_asked(gw):
    stream = gw.sdk("alpha").chat.completions.create(
        model="m-main", messages=CHAT, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].choices == []


def test_text_stream(gw):
    with gw.sdk("beta").completions.with_streaming_response.create(
        model="m-main", prompt="abc", max_tokens=5, stream=True
    ) as response:
        assert response.headers["x-priority-class"] == "INTERACTIVE"
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(c.choices[0].text for c in response.parse() if c.choices)
    assert text


def test_models_lists_what_enabled_backends_serve(gw):
    ids = {m.id for m in gw.sdk("alpha").models.list()}
    assert {"m-main", "m-slow", "m-vip"} <= ids
    assert "m-off" not in ids


def test_missing_unknown_and_revoked_keys_are_401(gw):
    for key in ("nope", "fg_0123456789_wrongsecret"):
        with pytest.raises(openai.AuthenticationError) as err:
            gw.sdk(key).chat.completions.create(model="m-main", messages=CHAT, max_tokens=1)
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert httpx.post(f"{gw.url}/v1/chat/completions", json={}).status_code == 401


def test_revoked_key_stops_working(gw):
    client = gw.sdk("revokable")
    client.chat.completions.create(model="m-main", messages=CHAT, max_tokens=1)
    prefix = gw.keys["revokable"].split("_")[1]
    gw.manage("apikey", "revoke", prefix)
    time.sleep(1.1)  # the documented bound: a lookup is cached for at most 1 s
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m-main", messages=CHAT, max_tokens=1)


@pytest.mark.parametrize(
    "kwargs, headers, fragment",
    [
        ({"model": "no-such-model"}, {}, "Unknown model"),
        ({"model": "m-main"}, {"X-Priority-Class": "PLATINUM"}, "Unknown priority class"),
        ({"model": "m-main", "max_tokens": 0}, {}, "max_tokens"),
        ({"model": "m-main"}, {"X-Request-Timeout-Ms": "soon"}, "X-Request-Timeout-Ms"),
        ({"model": "m-main"}, {"X-Request-Id": "has spaces"}, "X-Request-Id"),
    ],
)
def test_bad_requests_are_400_invalid_request(gw, kwargs, headers, fragment):
    kwargs.setdefault("max_tokens", 2)
    with pytest.raises(openai.BadRequestError) as err:
        gw.sdk("alpha").chat.completions.create(messages=CHAT, extra_headers=headers, **kwargs)
    assert err.value.status_code == 400 and err.value.code == "invalid_request"
    assert fragment in err.value.message


def test_malformed_json_and_missing_fields_are_400(gw):
    with gw.http("alpha") as http:
        for body in (
            b"{",
            b"[]",
            b'{"model": "m-main"}',
            b'{"model": "m-main", "messages": []}',
            b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}',
        ):
            response = http.post("/v1/chat/completions", content=body)
            assert response.status_code == 400, body
            assert response.json()["error"]["code"] == "invalid_request"
        response = http.post("/v1/completions", json={"model": "m-main", "prompt": {"x": 1}})
        assert response.status_code == 400


def test_unknown_paths_and_methods_answer_in_the_openai_shape(gw):
    with pytest.raises(openai.NotFoundError) as err:
        gw.sdk("alpha").models.retrieve("m-main")
    assert err.value.code == "not_found"
    with gw.http("alpha") as http:
        response = http.get("/v1/chat/completions")
        assert response.status_code == 405 and response.json()["error"]["type"] == "invalid_request_error"
        response = http.get("/nowhere")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_body_too_large_is_413_in_the_openai_shape(gw):
    big = b'{"model": "m-main", "prompt": "' + b"a" * (8 * 1024 * 1024 + 10) + b'"}'
    with gw.http("alpha") as http:
        response = http.post("/v1/completions", content=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_disabled_backend_is_503_no_backend(gw):
    with pytest.raises(openai.InternalServerError) as err:
        gw.sdk("alpha").chat.completions.create(model="m-off", messages=CHAT, max_tokens=1)
    assert err.value.status_code == 503 and err.value.code == "no_backend"


def test_duplicate_live_request_id_is_400(gw):
    client = gw.sdk("beta")
    first = threading.Thread(
        target=lambda: client.chat.completions.create(
            model="m-slow", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "dup-1"}
        )
    )
    first.start()
    wait_until(lambda: gw.http("beta").get("/v1/queue/dup-1").status_code == 200, what="dup-1 live")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="m-slow", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "dup-1"}
        )
    assert "already in use" in err.value.message
    first.join()
    # once it has ended, its id stays spent: the ledger charges each request id once
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="m-main", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "dup-1"}
        )
    assert "used by an earlier request" in err.value.message


def test_health_readiness_openapi_and_metrics(gw):
    assert httpx.get(f"{gw.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gw.url}/readyz").json()
    assert ready["status"] == "ready" and all(ready["checks"].values())
    doc = httpx.get(f"{gw.url}/v1/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/queue", "/v1/queue/{request_id}"} <= set(
        doc["paths"]
    )
    gw.sdk("alpha").chat.completions.create(model="m-main", messages=CHAT, max_tokens=1)
    text = httpx.get(f"{gw.url}/metrics").text
    for name in (
        "fairgate_queue_depth",
        "fairgate_queue_depth_limit",
        "fairgate_queue_wait_seconds_bucket",
        "fairgate_backend_slots_in_use",
        "fairgate_backend_tpm_used",
        "fairgate_aging_boosts",
        "fairgate_aging_preempts",
        "fairgate_rejects_total",
    ):
        assert name in text, name
    assert gw.metric("fairgate_backend_tpm_used", backend="b-main") > 0
    assert sim_stats(gw.extra["sims"]["main"])["completed"] > 0
