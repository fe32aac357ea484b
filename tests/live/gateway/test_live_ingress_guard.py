"""Bodies are not read before the key is checked, nor past their limit, whatever their framing: the
real `manage.py serve` and raw sockets. An unauthenticated chunked POST is answered 401 while the
client has sent only its headers; an authenticated body that streams in without end is cut off
with 413 at its limit; a Content-Length above the limit is refused 413 before any body is sent.
Every wait is bounded generously (ANSWER_LIMIT_S, below the body timeout that would otherwise end
the wait with a 408): the tests assert what is answered, never how fast.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.livestack import Gateway, start_gateway
from tests.support.rawsock import answer_until_closed
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

MAX_BODY_BYTES = 65_536
MAX_FILE_BYTES = 4_096
ANSWER_LIMIT_S = 20.0  # the body timeout below is longer: only a guard answers within this
BODY_TIMEOUT_S = 60
CHUNK = b"x" * 16_384
PATHS = ["/v1/chat/completions", "/v1/files"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory) -> Iterator[Gateway]:
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("fin")],
        backends=[backend("b", "http://127.0.0.1:9/v1")],  # never called
    )
    running = start_gateway(
        tmp_path_factory.mktemp("gw-ingress-guard"),
        yaml,
        {"fin": ("fin", "INTERACTIVE")},
        FAIRGATE_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
        FAIRGATE_FILE_MAX_BYTES=str(MAX_FILE_BYTES),
        FAIRGATE_BODY_TIMEOUT_MS=str(BODY_TIMEOUT_S * 1000),
        FAIRGATE_UPLOAD_TIMEOUT_MS=str(BODY_TIMEOUT_S * 1000),
    )
    yield running
    running.stop()


def _connect(gw: Gateway) -> socket.socket:
    address = urlsplit(gw.url)
    return socket.create_connection((address.hostname, address.port), timeout=ANSWER_LIMIT_S)


def _head(path: str, key: str | None, framing: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", framing]
    lines.append(
        "Content-Type: multipart/form-data; boundary=b" if path == "/v1/files" else "Content-Type: application/json"
    )
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket) -> bytes:
    return answer_until_closed(sock, limit_s=ANSWER_LIMIT_S, what="no answer")


def _status_and_error(answer: bytes) -> tuple[int, str, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head, "the connection was closed without an answer"
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]["code"], head.lower()


def _send_until_answered(sock: socket.socket) -> tuple[bytes, int]:
    """Chunks of CHUNK, sent without end until the server answers; then the answer, and how many
    bytes of body were sent."""
    sock.setblocking(False)
    frame = b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n"
    deadline_s = time.monotonic() + ANSWER_LIMIT_S
    sent = pending = 0
    while not select.select([sock], [], [], 0)[0]:
        if time.monotonic() > deadline_s:
            pytest.fail(f"the server read {sent} bytes of an endless body without answering")
        if not select.select([sock], [sock], [], 0.05)[1]:
            continue  # the server reads no more: its answer is what to wait for
        try:
            pending += sock.send(frame[pending:])
        except (BrokenPipeError, ConnectionResetError):
            break
        if pending == len(frame):
            sent, pending = sent + len(CHUNK), 0
    sock.setblocking(True)
    return _answer(sock), sent


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("key", [None, "fg_0123456789_made-up-secret"], ids=["no-key", "unknown-key"])
def test_an_unauthenticated_chunked_post_is_refused_401_before_its_body_is_sent(gw, path, key):
    with _connect(gw) as sock:
        sock.sendall(_head(path, key, "Transfer-Encoding: chunked"))  # and no body at all
        status, code, head = _status_and_error(_answer(sock))
    assert (status, code) == (401, "invalid_api_key")
    assert b"connection: close" in head


@pytest.mark.parametrize("path", PATHS)
def test_an_endless_chunked_body_is_cut_off_413_at_its_limit(gw, path):
    with _connect(gw) as sock:
        sock.sendall(_head(path, gw.keys["fin"], "Transfer-Encoding: chunked"))
        answer, sent = _send_until_answered(sock)
    status, code, head = _status_and_error(answer)
    assert (status, code) == (413, "request_too_large"), f"after {sent} bytes"
    assert b"connection: close" in head


@pytest.mark.parametrize("path", PATHS)
def test_a_content_length_above_the_limit_is_refused_413_before_the_body_is_sent(gw, path):
    with _connect(gw) as sock:
        sock.sendall(_head(path, gw.keys["fin"], f"Content-Length: {MAX_FILE_BYTES + 2 * MAX_BODY_BYTES}"))
        status, code, head = _status_and_error(_answer(sock))
    assert (status, code) == (413, "request_too_large")
    assert b"connection: close" in head


def test_a_chunked_body_within_the_limit_is_read_and_served(gw):
    """The guard lets a well-sized chunked body through: it is parsed (an unknown model: 400)."""
    body = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    half = len(body) // 2
    with _connect(gw) as sock:
        sock.sendall(_head("/v1/chat/completions", gw.keys["fin"], "Transfer-Encoding: chunked\r\nConnection: close"))
        for part in (body[:half], body[half:]):
            sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        status, code, _ = _status_and_error(_answer(sock))
    assert (status, code) == (400, "invalid_request")
