"""Slow clients cannot hold connections: the real `manage.py serve` with short header and body
timeouts, raw sockets that send partial headers or a partial body (whole, or dripped a byte at a
time), and the server must close them. Every wait is bounded generously (CLOSE_LIMIT_S): these
tests assert that a connection is closed, never how fast. A normal client is unaffected.
"""

from __future__ import annotations

import json
import re
import select
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.live.gateway.conftest import TIGHT_YAML
from tests.support.livestack import Gateway, free_port, start_gateway
from tests.support.rawsock import answer_until_closed

pytestmark = pytest.mark.live

HEADER_TIMEOUT_MS, BODY_TIMEOUT_MS = 500, 1000
CLOSE_LIMIT_S = 20.0  # far above both timeouts: only a connection that is never closed fails
DRIP_S = 0.05
PARTIAL_HEADERS = b"GET /console/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
BODY_HEADERS = (  # and the key's header (`_body_headers`): an unauthenticated body is refused before it is read
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n"
)


@pytest.fixture(scope="module")
def slow_gw(tmp_path_factory) -> Iterator[Gateway]:
    yaml_text = TIGHT_YAML.replace("{url}", f"http://127.0.0.1:{free_port()}/v1")  # never called
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw-slow"),
        yaml_text,
        {"beta": ("beta", "INTERACTIVE")},
        FAIRGATE_HEADER_TIMEOUT_MS=str(HEADER_TIMEOUT_MS),
        FAIRGATE_BODY_TIMEOUT_MS=str(BODY_TIMEOUT_MS),
    )
    yield gateway
    gateway.stop()


def _connect(gw: Gateway) -> socket.socket:
    address = urlsplit(gw.url)
    return socket.create_connection((address.hostname, address.port), timeout=CLOSE_LIMIT_S)


def _answer_until_closed(sock: socket.socket) -> bytes:
    return answer_until_closed(sock, limit_s=CLOSE_LIMIT_S, what="the server kept a slow connection open")


def _drip_until_answered(sock: socket.socket, drip: bytes) -> bytes:
    """Send ``drip`` a byte every DRIP_S (round and round) until the server answers or closes;
    then what it sends until it closes."""
    deadline_s = time.monotonic() + CLOSE_LIMIT_S
    sent = 0
    while not select.select([sock], [], [], DRIP_S)[0]:
        if time.monotonic() > deadline_s:
            pytest.fail(f"the server kept a dripping connection open for {CLOSE_LIMIT_S:.0f} s")
        try:
            sock.sendall(drip[sent % len(drip) :][:1])
        except (BrokenPipeError, ConnectionResetError):
            return b""
        sent += 1
    return _answer_until_closed(sock)


def _body_headers(gw: Gateway) -> bytes:
    return BODY_HEADERS + f"Authorization: Bearer {gw.keys['beta']}\r\n\r\n".encode()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_partial_headers_are_answered_408_and_closed(slow_gw):
    with _connect(slow_gw) as sock:
        sock.sendall(PARTIAL_HEADERS)
        answer = _answer_until_closed(sock)
    assert _status(answer) == 408, answer


def test_headers_dripped_a_byte_at_a_time_are_cut_off(slow_gw):
    with _connect(slow_gw) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\n")
        answer = _drip_until_answered(sock, b"X-Slowloris: keep-me-open\r\n")
    assert answer == b"" or _status(answer) == 408, answer


def test_many_silent_and_partial_connections_are_all_closed(slow_gw):
    socks = [_connect(slow_gw) for _ in range(20)]
    try:
        for sock in socks[::2]:
            sock.sendall(PARTIAL_HEADERS)
        answers = [_answer_until_closed(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert all(a == b"" for a in answers[1::2]), "a connection that sent nothing gets no answer, only closed"
    assert all(_status(a) == 408 for a in answers[::2])


def test_a_partial_body_is_answered_408_and_closed(slow_gw):
    with _connect(slow_gw) as sock:
        sock.sendall(_body_headers(slow_gw) + b'{"model": "m-one", ')
        answer = _answer_until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert _status(head) == 408 and b"connection: close" in head.lower(), head
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_body_dripped_a_byte_at_a_time_is_cut_off(slow_gw):
    with _connect(slow_gw) as sock:
        sock.sendall(_body_headers(slow_gw))
        answer = _drip_until_answered(sock, b'{"model": "m-one", "messages": []}')
    assert answer == b"" or _status(answer) == 408, answer[:200]


def _response(sock: socket.socket) -> bytes:
    """The head of one whole response (headers, then a Content-Length body) on a kept-alive connection."""
    data = b""
    while True:
        head, blank, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
        if blank and length and len(body) >= int(length[1]):
            return head
        chunk = sock.recv(65536)
        assert chunk, f"the connection was closed mid-response: {data!r}"
        data += chunk


def test_normal_clients_are_unaffected(slow_gw):
    """Complete requests are answered as before, and an idle keep-alive connection outlives the
    header timeout (only uvicorn's keep-alive timeout governs the gap between requests)."""
    with httpx.Client(base_url=slow_gw.url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/chat/completions", json={"model": "m-one", "messages": []}).status_code == 401
        assert client.get("/console/login/").status_code == 200
    with _connect(slow_gw) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _status(_response(sock)) == 200
            time.sleep(3 * HEADER_TIMEOUT_MS / 1000)  # idle on the same connection, past the header timeout
