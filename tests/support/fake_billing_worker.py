"""Fake billing workers for tests/unit/gateway/test_billing_worker_pipe.py: spawned like the real
one (billing.worker.serve), so this module is imported by the spawned process before Django is
set up: nothing at module level imports Django or an app."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import struct
import termios
import time

from billing import worker_protocol as billing_worker

Probe = tuple[int, int, bytes]  # (size of the answer, its seed, a blob the worker checks)


def pattern(size: int, seed: int) -> bytes:
    """An answer of ``size`` bytes that differs per seed (a misframed or misordered one shows)."""
    return (struct.pack("!I", seed) * (size // 4 + 1))[:size]


def answer_for(probe: Probe) -> tuple[bytes, int, bytes]:
    size, seed, blob = probe
    return pattern(size, seed), len(blob), hashlib.sha256(blob).digest()


def fake_serve(conn, gateway_pid: int, owner: str = "") -> None:
    """`billing_worker.serve` without Django: each batch of probes is answered as book_batch answers."""
    conn.send_bytes(billing_worker.READY)
    while (asks := _next_batch(conn)) is not None:
        conn.send_bytes(_answer(asks))


def fake_serve_in_pieces(conn, gateway_pid: int, owner: str = "") -> None:
    """`fake_serve` whose every message arrives in two pieces: the frame header and a little of the
    payload, then (once the gateway has read those) the rest."""
    _send_in_pieces(conn, billing_worker.READY)
    while (asks := _next_batch(conn)) is not None:
        _send_in_pieces(conn, _answer(asks))


def fake_serve_none(conn, gateway_pid: int, owner: str = "") -> None:
    """Books nothing: every ask's result is None (as for a release), with no console events. Sets
    Django up first, as the real one does: billing's asks unpickle only then."""
    import django

    django.setup()
    conn.send_bytes(billing_worker.READY)
    while (asks := _next_batch(conn)) is not None:
        conn.send_bytes(pickle.dumps(([None] * len(asks), {}, None), pickle.HIGHEST_PROTOCOL))


def _next_batch(conn) -> list | None:
    try:
        return pickle.loads(conn.recv_bytes())
    except EOFError:  # the gateway stopped
        return None


def _answer(asks: list[Probe]) -> bytes:
    return pickle.dumps(([answer_for(probe) for probe in asks], []), pickle.HIGHEST_PROTOCOL)


def _send_in_pieces(conn, message: bytes) -> None:
    """``send_bytes``' framing (a 4-byte big-endian length, then the payload), written in two parts:
    the first at most 1000 bytes, the rest once the gateway has read those."""
    frame = struct.pack("!i", len(message)) + message
    cut = min(1000, len(frame) // 2)  # READY's frame: its header, then the payload
    fd = conn.fileno()
    _write_all(fd, frame[:cut])
    while _unread_by_peer(fd):  # the gateway's reader has seen part of the frame before the rest is sent
        time.sleep(0.001)
    _write_all(fd, frame[cut:])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unread_by_peer(fd: int) -> int:
    """Bytes this end has sent that the other end has not read yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
