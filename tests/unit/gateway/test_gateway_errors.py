"""Client-visible failures, in process, through the gateway's real ASGI handler: the one mapping in
``api_view`` (a database that cannot be reached is 503 service_unavailable with Retry-After,
anything unexpected a 500 without details), the level each outcome is logged at (expected
outcomes at INFO, and Django does not log them again as warnings or errors), and which backend
headers reach the client."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import pytest
from django.db import InterfaceError, OperationalError
from django.urls import path

from billing.errors import DatabaseUnavailable
from gateway import views_ops
from gateway.asgi import GatewayASGIHandler
from gateway.errors import GatewayError, invalid_request
from gateway.proxy import relayed_headers
from gateway.upstream import Headers
from gateway.views import api_view

# What a view may raise, by name (made anew for each request).
RAISED: dict[str, Callable[[], BaseException]] = {
    "queue_full": lambda: GatewayError(429, "queue_full", "The BATCH queue is full.", retry_after_ms=1500),
    "queue_timeout": lambda: GatewayError(504, "queue_timeout", "Request r waited 60000 ms in class BATCH."),
    "budget_exhausted": lambda: GatewayError(402, "budget_exhausted", "Budget acme/2026 has 0 remaining."),
    "invalid_request": lambda: invalid_request("'messages' must be a non-empty array."),
    "no_backend": lambda: GatewayError(503, "no_backend", "No enabled backend serves model 'm' right now."),
    "connection_lost": lambda: OperationalError("consuming input failed: server closed the connection unexpectedly"),
    "connection_closed": lambda: InterfaceError("connection already closed"),
    "billing_database": lambda: DatabaseUnavailable("OperationalError: connection failed: Connection refused"),
    "bug": lambda: KeyError("secret detail"),
}
EXPECTED = ("queue_full", "queue_timeout", "budget_exhausted", "invalid_request", "no_backend")
OUTAGES = ("connection_lost", "connection_closed", "billing_database")


@api_view("POST")
async def raising(request, name: str):
    raise RAISED[name]()


urlpatterns = [path("fail/<str:name>", raising)]


class _Client:
    """uvicorn's side of one request: the body at once, http.disconnect once the answer is sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self._asked = False
        self._done = asyncio.Event()

    async def receive(self) -> dict:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self._done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self._done.set()


def serve(url_path: str, method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    """One request through GatewayASGIHandler: status, headers (lower-case names), body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": url_path,
        "raw_path": url_path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    client = _Client()
    asyncio.run(GatewayASGIHandler()(scope, client.receive, client.send))
    start, body = client.sent[0], b"".join(m.get("body", b"") for m in client.sent[1:])
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


@pytest.fixture
def failing_urls(settings):
    settings.ROOT_URLCONF = __name__


def _loud(caplog, level: int = logging.WARNING) -> list[str]:
    return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= level]


@pytest.mark.parametrize("name", OUTAGES)
def test_a_database_outage_is_503_service_unavailable_with_retry_after(failing_urls, name):
    status, headers, body = serve(f"/fail/{name}")
    assert status == 503
    error = json.loads(body)["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "service_unavailable"
    assert "Retry-After" in error["message"] and "server closed" not in error["message"]
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"
    assert "x-should-retry" not in headers


def test_an_unexpected_exception_is_a_500_without_details_logged_once_with_its_traceback(failing_urls, caplog):
    caplog.set_level(logging.INFO)
    status, _, body = serve("/fail/bug")
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"
    assert b"secret detail" not in body
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["gateway.views"] and errors[0].exc_info is not None


@pytest.mark.parametrize("name", EXPECTED)
def test_an_expected_outcome_is_logged_at_info_and_not_again_by_django(failing_urls, caplog, name):
    caplog.set_level(logging.INFO)
    status, _, body = serve(f"/fail/{name}")
    assert json.loads(body)["error"]["code"] == name and status >= 400
    assert _loud(caplog) == []
    assert [r.levelno for r in caplog.records if r.name == "gateway.views" and name in r.getMessage()] == [logging.INFO]


def test_a_database_outage_is_logged_once_as_a_warning(failing_urls, caplog):
    caplog.set_level(logging.INFO)
    serve("/fail/connection_lost")
    assert _loud(caplog) == [
        "WARNING gateway.views: POST /fail/connection_lost: 503 service_unavailable "
        "(OperationalError: consuming input failed: server closed the connection unexpectedly)"
    ]


def test_readyz_is_503_while_the_database_is_down_and_logged_once(monkeypatch, caplog):
    def ping() -> None:
        raise OperationalError("connection failed: Connection refused")

    monkeypatch.setattr(views_ops, "_db_ping", ping)
    caplog.set_level(logging.INFO)
    status, _, body = serve("/readyz", method="GET")
    assert status == 503 and json.loads(body)["checks"]["database"] is False
    assert _loud(caplog) == [
        "WARNING gateway.views_ops: readiness check failed: OperationalError: connection failed: Connection refused"
    ]


def test_unknown_path_404_is_logged_at_info_and_not_again_by_django(caplog):
    caplog.set_level(logging.INFO)
    status, _, body = serve("/v1/nothing-here", method="GET")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    assert _loud(caplog) == []


def test_only_allowed_backend_headers_are_relayed():
    upstream = Headers(
        [
            ("content-type", "application/json"),
            ("openai-processing-ms", "12"),
            ("openai-version", "2020-10-01"),
            ("x-sim-service-ms", "40"),
            ("x-sim-ttft-ms", "5"),
            ("x-sim-prompt-tokens", "9"),
            ("x-sim-completion-tokens", "5"),
            ("x-sim-reject-reason", "slots"),
            ("connection", "keep-alive"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("upgrade", "h2c"),
            ("proxy-authenticate", "Basic"),
            ("content-length", "3"),
            ("content-encoding", "gzip"),
            ("date", "Tue, 01 Dec 2026 07:00:00 GMT"),
            ("server", "uvicorn"),
            ("set-cookie", "sid=1"),
            ("x-request-id", "theirs"),
            ("openai-organization", "org-upstream"),
            ("openai-project", "proj_upstream"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-limit-tokens", "90000"),
            ("retry-after", "1"),
            ("retry-after-ms", "900"),
            ("x-should-retry", "true"),
        ]
    )
    assert relayed_headers(upstream) == [
        ("content-type", "application/json"),
        ("openai-processing-ms", "12"),
        ("openai-version", "2020-10-01"),
    ]
