"""Connections per client address (gateway.connlimit) in `manage.py serve`'s protocol: from an address
refused a key lately, past the limit a connection is never read (paused at its accept, or before
its first request is parsed; the app never called), then answered 429 and closed; an address never
refused, a trusted proxy and an address whose refusal is old are not limited; a closed connection
gives its place back. Time is injected."""

from __future__ import annotations

import asyncio
import time

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway import auth, connlimit
from gateway.connlimit import ConnectionLimit
from gateway.management.commands.serve import HeaderTimeoutProtocol

PROXY = "10.0.0.7"
STRANGER = "192.0.2.1"
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer fg_cccccccccc_x\r\n"
    b"content-length: 2\r\n\r\n{}"
)


def request(key: str) -> bytes:
    return REQUEST.replace(b"fg_cccccccccc_x", key.encode())


class Transport(asyncio.Transport):
    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer
        self.paused = False
        self.written = b""
        self.closed = False
        self.protocol: HeaderTimeoutProtocol | None = None

    def get_extra_info(self, name, default=None):
        return {"peername": (self.peer, 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def get_protocol(self):
        return self.protocol

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            assert self.protocol is not None
            self.protocol.connection_lost(None)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limit(settings, clock):
    settings.FAIRGATE_TRUSTED_PROXIES = [PROXY]
    settings.FAIRGATE_HEADER_TIMEOUT_MS = 60_000
    made = ConnectionLimit(per_address=2, hold_s=0.01, max_held=3, clock=clock, jitter=lambda: 0.5)
    saved, connlimit._limit = connlimit._limit, made
    auth.cache_clear()  # no key is sure to be refused from the cache but a malformed one
    yield made
    connlimit._limit = saved
    auth.cache_clear()


def connect(loop: asyncio.AbstractEventLoop, peer: str, calls: list[dict]) -> Transport:
    async def app(scope, receive, send):
        calls.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    config = Config(app=app, http=HeaderTimeoutProtocol, lifespan="off", log_level="critical")
    config.load()
    protocol = HeaderTimeoutProtocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = Transport(peer)
    transport.protocol = protocol
    protocol.connection_made(transport)
    return transport


async def until(check, what: str) -> None:
    async with asyncio.timeout(30):
        while not check():
            await asyncio.sleep(0.005)


def test_past_the_limit_a_connection_is_not_read_then_answered_429_and_closed(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.refused(STRANGER)
        read = [connect(loop, STRANGER, calls) for _ in range(2)]
        assert limit.read == {STRANGER: 2}
        assert not any(t.paused for t in read)
        held = connect(loop, STRANGER, calls)
        assert held.paused and held.written == b"" and not held.closed
        assert limit.held == 1 and limit.read == {STRANGER: 2}
        held.protocol.data_received(REQUEST)  # data arriving anyway (uvloop starts reading after connection_made)
        assert held.paused and held.written == b""
        read[0].protocol.data_received(REQUEST)  # a counted connection is served as before
        await until(lambda: read[0].written.startswith(b"HTTP/1.1 204"), "the first connection's answer")
        await until(lambda: held.closed, "the held connection closed")
        assert held.written.startswith(b"HTTP/1.1 429 ") and b"too_many_connections" in held.written
        assert limit.held == 0
        assert [c["client"][0] for c in calls] == [STRANGER]  # the held one never reached the app
        read[1].close()
        assert limit.read == {STRANGER: 1}
        again = connect(loop, STRANGER, calls)  # its place given back
        assert not again.paused and limit.read == {STRANGER: 2}
        read[0].close()
        again.close()
        assert limit.read == {}

    asyncio.run(scenario())


def test_connections_accepted_before_the_refusal_are_held_before_their_first_request_is_parsed(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        wave = [connect(loop, STRANGER, calls) for _ in range(5)]  # accepted at once, nothing read yet
        assert limit.read == {STRANGER: 5} and not any(t.paused for t in wave)
        limit.refused(STRANGER)  # the first one's key was refused meanwhile
        for transport in wave:
            transport.protocol.data_received(REQUEST)
        assert [t.paused for t in wave] == [True, True, True, False, False]  # until 2 are left being read
        assert limit.read == {STRANGER: 2} and limit.held == 3
        await until(lambda: len(calls) == 2, "the two left being read served")
        await until(lambda: all(t.closed for t in wave[:3]), "the held ones answered")
        assert all(t.written.startswith(b"HTTP/1.1 429 ") for t in wave[:3])
        assert limit.held == 0

    asyncio.run(scenario())


def test_an_address_never_refused_a_trusted_proxy_and_an_old_refusal_are_not_limited(limit, clock):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.refused(PROXY)
        proxied = [connect(loop, PROXY, calls) for _ in range(5)]
        valid = [connect(loop, "192.0.2.2", calls) for _ in range(5)]  # a busy client, never refused
        limit.refused(STRANGER)
        clock.now_s += connlimit.REFUSED_KEEP_S + 1  # its refusal is old now
        others = [connect(loop, STRANGER, calls) for _ in range(5)]
        for transport in proxied + valid + others:
            transport.protocol.data_received(REQUEST)
        assert not any(t.paused for t in proxied + valid + others)
        assert limit.read == {"192.0.2.2": 5, STRANGER: 5} and limit.held == 0
        for transport in proxied + valid + others:
            transport.close()
        assert limit.read == {}

    asyncio.run(scenario())


def test_past_the_bound_of_held_connections_one_is_answered_at_once(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.refused(STRANGER)
        for _ in range(2):
            connect(loop, STRANGER, calls)
        held = [connect(loop, STRANGER, calls) for _ in range(3)]
        assert limit.held == 3 and not any(t.closed for t in held)
        at_once = connect(loop, STRANGER, calls)
        assert at_once.closed and at_once.written.startswith(b"HTTP/1.1 429 ")
        assert limit.held == 3

    asyncio.run(scenario())


def test_no_limit_when_set_to_zero():
    limit = ConnectionLimit(per_address=0, hold_s=5.0, max_held=10, exempt=lambda _: False)
    limit.refused(STRANGER)
    assert [limit.admit(STRANGER) for _ in range(100)] == [(None, True)] * 100
    assert limit.read == {} and limit.refused_until == {}


def test_a_key_the_cache_knows_to_be_refused_limits_its_address_before_the_app_runs(limit):
    usable_prefix, made_up = "a" * 10, "b" * 10
    auth._usable = (frozenset({usable_prefix}), time.monotonic() + 60)  # fresh (the fixture clears it)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        valid = connect(loop, "192.0.2.2", calls)
        valid.protocol.data_received(request(f"fg_{usable_prefix}_{'0' * 48}"))  # not sure to be refused
        assert limit.refused_until == {}
        wave = [connect(loop, STRANGER, calls) for _ in range(4)]
        wave[0].protocol.data_received(request(f"fg_{made_up}_{'0' * 48}"))
        assert STRANGER in limit.refused_until and calls == []  # marked from its headers, before the app
        for transport in wave[1:]:
            transport.protocol.data_received(request(f"fg_{made_up}_{'1' * 48}"))
        assert [t.paused for t in wave] == [False, True, True, False]  # held down to 2 being read
        assert limit.read == {"192.0.2.2": 1, STRANGER: 2}

    asyncio.run(scenario())
