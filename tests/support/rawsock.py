"""Raw-socket reading for the live tests that speak HTTP by hand (slow clients, ingress guards)."""

from __future__ import annotations

import socket
import time

import pytest


def answer_until_closed(sock: socket.socket, *, limit_s: float, what: str) -> bytes:
    """What the server sends until it closes the connection (sending nothing more meanwhile);
    fails the test, saying ``what`` was left open, if it is not closed within ``limit_s``."""
    deadline_s = time.monotonic() + limit_s
    answer = b""
    while True:
        sock.settimeout(max(0.01, deadline_s - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"{what}: not closed within {limit_s:.0f} s; got {answer[:200]!r}")
        except ConnectionResetError:
            return answer
        if not chunk:
            return answer
        answer += chunk
