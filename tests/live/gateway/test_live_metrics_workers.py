"""/metrics and the access log under ``serve --workers 2`` (the shared scheduler on real Redis).

Each scrape is answered by whichever process accepts the connection; every one of them must show
every request, whichever process served it. Each request writes one access-log line, and the
client's ``traceparent`` reaches the backend (one is made when the client sent none).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.support.livestack import start_gateway, wait_for, wait_until
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.redis
SCRAPES = 6
MAX_REQUESTS = 80  # sent until both processes have served some
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FIELDS = {
    "request_id", "tenant", "class", "model", "backend", "status", "outcome", "queue_wait_ms", "ttft_ms",
    "total_ms", "prompt_tokens", "completion_tokens", "charge",
}  # fmt: skip


class _Capture(BaseHTTPRequestHandler):
    """A backend that answers every chat at once and keeps the ``traceparent`` it was sent."""

    seen: list[str | None] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        _Capture.seen.append(self.headers.get("traceparent"))
        body = json.dumps(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": "echo",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def capture():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Capture.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def two_workers(tmp_path, start_sim, capture):
    sim = start_sim(slots=8, ttft_ms=5, tokens_per_s=2000)
    yaml_text = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("acme", share=0.5), tenant("bolt", share=0.5)],
        backends=[backend("gpu", f"{sim.url}/v1", slots=8), backend("echo", f"{capture}/v1", models=["echo"])],
    )
    keys = {"acme": ("acme", "INTERACTIVE"), "bolt": ("bolt", "BATCH")}
    gateway = start_gateway(
        tmp_path,
        yaml_text,
        keys,
        workers=2,
        FAIRGATE_SCHEDULER="shared",
        FAIRGATE_SHARED_PREFIX=f"fairgate:test:metrics:{os.getpid()}:{secrets.token_hex(4)}",
        FAIRGATE_ACCESS_LOG="1",
    )
    yield gateway
    gateway.stop()


def _access_lines(gateway) -> list[dict]:
    return [json.loads(line) for line in gateway.log().splitlines() if line.startswith('{"time"')]


def _requests_total(text: str) -> float:
    return sum(
        float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("fairgate_requests_total{")
    )


def _chat(gateway, key: str, *, stream: bool, model: str = "m", headers: dict | None = None) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": stream}
    auth = {"Authorization": f"Bearer {gateway.keys[key]}", **(headers or {})}
    with httpx.Client(base_url=gateway.url, headers=auth, timeout=30) as client:  # a connection each
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text


def test_every_scrape_shows_every_request_of_every_process(two_workers):
    gateway = two_workers
    sent = 0
    while sent < MAX_REQUESTS:
        _chat(gateway, ("acme", "bolt")[sent % 2], stream=sent % 3 == 0)
        sent += 1
        if sent >= 6 and len({line["pid"] for line in _access_lines(gateway)}) == 2:
            break
    lines = wait_for(lambda: _access_lines(gateway), lambda got: len(got) == sent, what="a line per request")
    assert len({line["pid"] for line in lines}) == 2, "one process served every request: nothing is shown"
    for line in lines:
        assert FIELDS <= line.keys(), line
        assert line["status"] == 200 and line["outcome"] == "completed" and line["backend"] == "gpu"
        assert line["tenant"] in ("acme", "bolt") and line["completion_tokens"] > 0 and line["charge"] is not None
    assert {line["class"] for line in lines} == {"INTERACTIVE", "BATCH"}

    scrapes = [httpx.get(f"{gateway.url}/metrics", headers={"Connection": "close"}).text for _ in range(SCRAPES)]
    assert [_requests_total(text) for text in scrapes] == [sent] * SCRAPES
    for text in scrapes:
        for series in (
            'fairgate_requests_total{cls="INTERACTIVE",outcome="completed",tenant="acme"}',
            'fairgate_tokens_total{cls="BATCH",kind="completion",tenant="bolt"}',
            'fairgate_spend_total{cls="INTERACTIVE",tenant="acme"}',
            'fairgate_time_to_first_token_seconds_count{cls="BATCH",tenant="bolt"}',
            'fairgate_queue_wait_seconds_count{cls="INTERACTIVE",tenant="acme"}',
        ):
            assert series in text, series


def test_unknown_keys_and_classes_make_no_series_and_traceparent_goes_upstream(two_workers):
    gateway = two_workers
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert (
            client.post("/v1/chat/completions", json=chat, headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        invented = {"Authorization": f"Bearer {gateway.keys['acme']}", "X-Priority-Class": "MADE_UP"}
        assert client.post("/v1/chat/completions", json=chat, headers=invented).status_code == 400
    _chat(gateway, "acme", stream=False, model="echo", headers={"traceparent": TRACEPARENT})
    _chat(gateway, "bolt", stream=False, model="echo")
    assert _Capture.seen[0] == TRACEPARENT
    made = _Capture.seen[1]
    assert made is not None and re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", made) and made != TRACEPARENT
    wait_until(lambda: len(_access_lines(gateway)) == 4, what="a line per request, refusals included")
    lines = _access_lines(gateway)
    assert [(line["status"], line["outcome"]) for line in lines[:2]] == [
        (401, "invalid_api_key"),
        (400, "invalid_request"),
    ]
    assert {line["trace_id"] for line in lines[2:]} == {TRACEPARENT[3:35], made[3:35]}
    text = httpx.get(f"{gateway.url}/metrics").text
    assert "MADE_UP" not in text and "nope" not in text
    assert _requests_total(text) == 2
