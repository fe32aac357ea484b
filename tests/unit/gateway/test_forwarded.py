"""X-Forwarded-Proto and X-Forwarded-For on the console's side (gateway.forwarded): believed from a
peer in FAIRGATE_TRUSTED_PROXIES, ignored from any other. The last tests go through Django's ASGI
handler (with the settings' middleware, made after the test's settings) to a console page, as a
request from nginx or from a stranger would; tests/live/console/test_live_tls_ingress.py serves
config.asgi itself behind nginx."""

from __future__ import annotations

import asyncio

import pytest
from django.core.handlers.asgi import ASGIHandler

from gateway.forwarded import ForwardedHeaders, forwarded_scope

PROXY = "10.0.0.7"
STRANGER = "192.0.2.1"


def scope(peer: str, *, kind: str = "http", proto: str | None = "https", xff: str | None = "203.0.113.9") -> dict:
    headers = [(b"host", b"llm.example.com")]
    if proto is not None:
        headers.append((b"x-forwarded-proto", proto.encode()))
    if xff is not None:
        headers.append((b"x-forwarded-for", xff.encode()))
    return {"type": kind, "scheme": "ws" if kind == "websocket" else "http", "client": (peer, 5555), "headers": headers}


@pytest.fixture(autouse=True)
def trusted(settings):
    settings.FAIRGATE_TRUSTED_PROXIES = ["10.0.0.0/24"]


def test_a_trusted_proxy_gives_the_clients_scheme_and_address():
    seen = forwarded_scope(scope(PROXY))
    assert seen["scheme"] == "https"
    assert seen["client"] == ("203.0.113.9", 0)


def test_a_websocket_through_a_trusted_tls_proxy_is_wss():
    assert forwarded_scope(scope(PROXY, kind="websocket"))["scheme"] == "wss"
    assert forwarded_scope(scope(PROXY, kind="websocket", proto="http"))["scheme"] == "ws"


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_an_untrusted_peer_is_taken_at_its_word_of_nothing(kind):
    given = scope(STRANGER, kind=kind)
    seen = forwarded_scope(given)
    assert seen["scheme"] == given["scheme"] and seen["client"] == (STRANGER, 5555)


def test_nothing_is_believed_when_no_proxy_is_trusted(settings):
    settings.FAIRGATE_TRUSTED_PROXIES = []
    seen = forwarded_scope(scope(PROXY))
    assert seen["scheme"] == "http" and seen["client"] == (PROXY, 5555)


def test_an_unknown_proto_and_a_chain_of_trusted_hops():
    seen = forwarded_scope(scope(PROXY, proto="gopher", xff="198.51.100.4, 10.0.0.9"))
    assert seen["scheme"] == "http"  # unchanged
    assert seen["client"] == ("198.51.100.4", 0)  # the first untrusted hop from the right
    assert forwarded_scope(scope(PROXY, proto="http, https"))["scheme"] == "https"  # the nearest proxy's word


def _get(path: str, peer: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[bytes, bytes]]:
    """One GET through Django's ASGI handler behind ForwardedHeaders: (status, response headers)."""
    application = ForwardedHeaders(ASGIHandler())

    request = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"llm.example.com"), *headers],
        "client": (peer, 5555),
        "server": ("127.0.0.1", 8000),
    }
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays: Django's disconnect listener waits here until cancelled
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(application(request, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {name.lower(): value for name, value in start["headers"]}


@pytest.fixture
def https_public(settings):
    settings.ALLOWED_HOSTS = ["llm.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600


@pytest.mark.django_db
def test_the_console_behind_a_trusted_proxy_is_served_as_https(https_public):
    status, headers = _get("/console/login/", PROXY, [(b"x-forwarded-proto", b"https")])
    assert status == 200
    assert headers[b"strict-transport-security"] == b"max-age=3600"


@pytest.mark.django_db
def test_a_stranger_claiming_https_is_sent_to_https(https_public):
    status, headers = _get("/console/login/", STRANGER, [(b"x-forwarded-proto", b"https")])
    assert status == 301
    assert headers[b"location"] == b"https://llm.example.com/console/login/"
    assert b"strict-transport-security" not in headers
