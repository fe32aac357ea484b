"""The request path leaves no cyclic garbage: what a request allocates goes by reference counting.

At a thousand requests a second, a few dozen objects per request tied in cycles made the
collector's full passes take 50-100 ms, once a second or more, stalling every request in flight.
These tests count what only the collector could free after many requests (gc.DEBUG_SAVEALL keeps
it in gc.garbage instead of freeing it).
"""

from __future__ import annotations

import asyncio
import gc

import pytest
from django.http import HttpResponse

from gateway.asgi import GatewayASGIHandler
from gateway.upstream import Pool
from tests.live.gateway.test_upstream_client import _ok, _serve

REQUESTS = 50


async def _cyclic_garbage(make_requests) -> list:
    """Objects only the collector could free, left by ``await make_requests()``."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await make_requests()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _summary(garbage: list) -> str:
    kinds: dict[str, int] = {}
    for obj in garbage:
        kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:10])


class _Client:
    """The server's side of one request, as uvicorn gives it: ``receive`` answers http.disconnect
    once the response is complete, or at once if the client has left."""

    def __init__(self, *, left: bool = False) -> None:
        self.sent: list[dict] = []
        self.done = asyncio.Event()
        if left:
            self.done.set()

    async def receive(self) -> dict:
        await self.done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.done.set()


class _Handler(GatewayASGIHandler):
    def __init__(self, view_s: float = 0.0) -> None:
        super().__init__()
        self.view_s = view_s
        self.views_ended = 0

    async def run_get_response(self, request):
        try:
            await asyncio.sleep(self.view_s)
            return HttpResponse(b'{"ok": true}', content_type="application/json")
        finally:
            self.views_ended += 1


def test_the_view_and_disconnect_listener_leave_no_cycles():
    async def scenario():
        handler = _Handler()
        clients = [_Client() for _ in range(REQUESTS)]

        async def requests():
            for client in clients:
                await handler._respond(None, client.receive, client.send)

        garbage = await _cyclic_garbage(requests)
        assert all(
            c.sent[-1] == {"type": "http.response.body", "body": b'{"ok": true}', "more_body": False} for c in clients
        )
        assert len(garbage) < REQUESTS, f"cyclic garbage after {REQUESTS} requests: {_summary(garbage)}"

    asyncio.run(scenario())


def test_a_client_that_leaves_cancels_the_view_and_nothing_is_sent():
    async def scenario():
        handler = _Handler(view_s=5.0)
        client = _Client(left=True)
        await asyncio.wait_for(handler._respond(None, client.receive, client.send), 2)
        assert handler.views_ended == 1 and client.sent == []

    asyncio.run(scenario())


def test_a_broken_receive_cancels_the_view_and_its_error_is_raised():
    async def scenario():
        handler = _Handler(view_s=5.0)

        async def receive():
            raise OSError("connection reset")

        with pytest.raises(OSError, match="connection reset"):
            await asyncio.wait_for(handler._respond(None, receive, _Client().send), 2)
        assert handler.views_ended == 1

    asyncio.run(scenario())


def test_upstream_exchanges_leave_no_cycles():
    async def scenario():
        server, port, _ = await _serve(lambda request, n: _ok(b'{"n": %d}' % n))
        pool = Pool(f"http://127.0.0.1:{port}/v1", connect_timeout_s=2, read_timeout_s=2)
        await (await pool.post("/chat/completions", b"{}", {})).aread()  # the connection, made once

        async def requests():
            for _ in range(REQUESTS):
                response = await pool.post("/chat/completions", b"{}", {})
                assert (await response.aread()).startswith(b'{"n": ')
                await response.aclose()

        garbage = await _cyclic_garbage(requests)
        server.close()
        assert len(garbage) < REQUESTS, f"cyclic garbage after {REQUESTS} requests: {_summary(garbage)}"

    asyncio.run(scenario())
