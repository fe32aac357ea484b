"""Connections per client address (gateway.connlimit) in `manage.py serve`'s protocol. From an
address without a valid key lately, past the limit a connection is paused at its accept, before
uvicorn's protocol is set up: it waits unread for a place, for a valid key from its address (then
all of them are read: a tenant's burst of connections from a new address gets through), or for its
wait to end (then it is read anyway); from an address refused a key lately it is held unread, then
answered 429 and closed, never parsed nor reaching the app. A trusted proxy is never limited; a
closed connection gives its place back. The gateway's ASGI handler and `gateway.auth` mark an
address that presents a valid key. Against real uvloop sockets: a paused connection's first read
(uvloop reads once after connection_made whatever it is told) is neither parsed nor lost. Time is
injected where it decides; hold and wait timers are short and awaited by state."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync
from django.urls import path
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway import auth, connlimit
from gateway.asgi import GatewayASGIHandler
from gateway.connlimit import HOLD, READ, WAIT, ConnectionLimit
from gateway.errors import GatewayError
from gateway.management.commands.serve import HeaderTimeoutProtocol
from gateway.views import api_view, json_response
from tenants.keys import key_generate
from tenants.models import ApiKey, Tenant
from tests.support.fake_transport import FakeTransport

PROXY = "10.0.0.7"
STRANGER = "192.0.2.1"
TENANT = "192.0.2.2"
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer fg_cccccccccc_x\r\n"
    b"content-length: 2\r\n\r\n{}"
)
VALID = "fg_vvvvvvvvvv_" + "0" * 48  # what the fake app below takes for a valid key


def request(key: str) -> bytes:
    return REQUEST.replace(b"fg_cccccccccc_x", key.encode())


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _install(made: ConnectionLimit):
    saved, connlimit._limit = connlimit._limit, made
    auth.cache_clear()  # no key is sure to be refused from the cache but a malformed one
    return saved


@pytest.fixture
def limit(settings, clock):
    settings.FAIRGATE_TRUSTED_PROXIES = [PROXY]
    settings.FAIRGATE_HEADER_TIMEOUT_MS = 60_000
    made = ConnectionLimit(per_address=2, hold_s=0.01, wait_s=600, max_held=1_000, clock=clock, jitter=lambda: 0.5)
    saved = _install(made)
    yield made
    connlimit._limit = saved
    auth.cache_clear()


async def app(scope, receive, send):
    """Answers 204; marks the address of VALID's requests as the gateway's handler and gateway.auth
    do."""
    scope["state"]["calls"].append(scope)
    authorization = dict(scope["headers"]).get(b"authorization", b"").decode()
    if authorization == f"Bearer {VALID}":
        connlimit.CLIENT.set(scope["client"][0])
        connlimit.key_accepted()
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def connect(loop: asyncio.AbstractEventLoop, peer: str, calls: list[dict]) -> FakeTransport:
    config = Config(app=app, http=HeaderTimeoutProtocol, lifespan="off", log_level="critical")
    config.load()
    state = ServerState()
    protocol = HeaderTimeoutProtocol(config=config, server_state=state, app_state={"calls": calls}, _loop=loop)
    transport = FakeTransport(peer)
    transport.protocol = protocol
    protocol.connection_made(transport)
    return transport


def set_up(transport: FakeTransport) -> bool:
    """Whether uvicorn's protocol was set up for this connection (it is being read)."""
    protocol = transport.protocol
    assert protocol is not None
    return protocol.made and protocol in protocol.server_state.connections


async def until(check, what: str) -> None:
    async with asyncio.timeout(30):
        while not check():
            await asyncio.sleep(0.005)


def test_past_the_limit_a_connection_from_a_refused_address_is_not_read_then_answered_429_and_closed(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.refused(STRANGER)
        read = [connect(loop, STRANGER, calls) for _ in range(2)]
        assert limit.read == {STRANGER: 2}
        assert not any(t.paused for t in read) and all(set_up(t) for t in read)
        held = connect(loop, STRANGER, calls)
        assert held.paused and held.written == b"" and not held.closed and not set_up(held)
        assert limit.held == 1 and limit.read == {STRANGER: 2} and limit.waiting == {}
        held.protocol.data_received(REQUEST)  # data arriving anyway (uvloop starts reading after connection_made)
        assert held.paused and held.written == b"" and held.protocol.early == b""
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


def test_past_the_limit_a_connection_from_an_address_without_a_valid_key_waits_unread_for_a_place(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        wave = [connect(loop, STRANGER, calls) for _ in range(5)]
        assert limit.read == {STRANGER: 2} and [set_up(t) for t in wave] == [True, True, False, False, False]
        assert [t.paused for t in wave] == [False, False, True, True, True] and limit.held == 3
        for transport in wave:
            transport.protocol.data_received(REQUEST)  # uvloop's one read of each
        assert [t.paused for t in wave] == [False, False, True, True, True]
        await until(lambda: len(calls) == 2, "the two read served")
        await asyncio.sleep(0.05)
        assert len(calls) == 2 and all(t.written == b"" for t in wave[2:])  # the others not parsed
        wave[0].close()  # a place given back: the oldest waiting is read, its first read parsed
        await until(lambda: len(calls) == 3, "the oldest waiting one served")
        assert wave[2].written.startswith(b"HTTP/1.1 204") and not wave[2].paused and set_up(wave[2])
        assert [t.paused for t in wave[3:]] == [True, True] and limit.read == {STRANGER: 2} and limit.held == 2
        wave[4].close()  # one waiting leaves: no place taken
        assert limit.read == {STRANGER: 2} and list(limit.waiting[STRANGER]) == [wave[3].protocol]
        assert limit.held == 1

    asyncio.run(scenario())


def test_a_tenants_burst_from_a_new_address_is_all_read_once_one_request_presents_a_valid_key(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        burst = [connect(loop, TENANT, calls) for _ in range(200)]
        assert limit.read == {TENANT: 2} and limit.held == 198
        for transport in burst[2:]:
            transport.protocol.data_received(request(VALID))
        assert calls == []
        burst[0].protocol.data_received(request(VALID))  # the first request's key is valid
        await until(lambda: len(calls) == 199, "every waiting one read and served")
        assert all(t.written.startswith(b"HTTP/1.1 204") for t in [burst[0], *burst[2:]])
        assert limit.held == 0 and limit.waiting == {} and limit.read == {TENANT: 200}
        more = [connect(loop, TENANT, calls) for _ in range(50)]  # not limited now
        assert not any(t.paused for t in more) and all(set_up(t) for t in more)
        limit.refused(TENANT)  # a bad key from it later does not limit it while its valid key is fresh
        assert not connect(loop, TENANT, calls).paused

    asyncio.run(scenario())


def test_connections_waiting_when_their_address_is_refused_are_held_unread_then_answered_429(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.wait_s = 0.01
        wave = [connect(loop, STRANGER, calls) for _ in range(6)]
        for transport in wave[2:]:
            transport.protocol.data_received(REQUEST)
        assert len(limit.waiting[STRANGER]) == 4 and limit.held == 4
        assert all(t.protocol.early == REQUEST for t in wave[2:])
        limit.refused(STRANGER)  # a key from it refused
        assert limit.waiting == {} and all(t.protocol.early == b"" for t in wave[2:])
        for transport in wave[:2]:
            transport.protocol.data_received(REQUEST)
        await until(lambda: len(calls) == 2 and all(t.closed for t in wave[2:]), "served, and held then answered")
        assert all(t.written.startswith(b"HTTP/1.1 429 ") and not set_up(t) for t in wave[2:])
        assert [c["client"][0] for c in calls] == [STRANGER] * 2 and limit.held == 0
        wave[0].close()  # a place given back goes to no one while the address is refused
        assert limit.read == {STRANGER: 1}

    asyncio.run(scenario())


def test_a_connection_whose_wait_is_over_is_read_and_one_read_past_the_limit_is_held_if_then_refused(settings, clock):
    settings.FAIRGATE_HEADER_TIMEOUT_MS = 60_000
    made = ConnectionLimit(per_address=2, hold_s=0.01, wait_s=0.01, max_held=50, clock=clock, jitter=lambda: 0.5)
    saved = _install(made)
    try:

        async def scenario() -> None:
            loop = asyncio.get_running_loop()
            calls: list[dict] = []
            wave = [connect(loop, STRANGER, calls) for _ in range(5)]
            await until(lambda: made.read == {STRANGER: 5}, "the waiting ones read after their wait")
            assert all(set_up(t) and not t.paused for t in wave) and made.held == 0
            made.refused(STRANGER)  # refused before their first request came in
            for transport in wave:
                transport.protocol.data_received(REQUEST)
            assert [t.paused for t in wave] == [True, True, True, False, False]  # held down to 2 being read
            assert made.read == {STRANGER: 2} and made.held == 3
            await until(lambda: len(calls) == 2 and all(t.closed for t in wave[:3]), "served and held")
            assert all(t.written.startswith(b"HTTP/1.1 429 ") for t in wave[:3])

        asyncio.run(scenario())
    finally:
        connlimit._limit = saved
        auth.cache_clear()


def test_a_trusted_proxy_and_an_address_with_a_valid_key_are_not_limited_an_old_refusal_no_more_than_others(
    limit, clock
):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.refused(PROXY)
        proxied = [connect(loop, PROXY, calls) for _ in range(5)]
        limit.authenticated(TENANT)
        valid = [connect(loop, TENANT, calls) for _ in range(5)]
        limit.refused(STRANGER)
        clock.now_s += connlimit.REFUSED_KEEP_S + 1  # its refusal is old now
        others = [connect(loop, STRANGER, calls) for _ in range(5)]
        assert not any(t.paused for t in proxied + valid) and limit.read == {TENANT: 5, STRANGER: 2}
        assert [t.paused for t in others] == [False, False, True, True, True]
        assert list(limit.waiting) == [STRANGER]  # waiting, not held
        clock.now_s += connlimit.GOOD_KEEP_S + 1  # the valid key is old now
        assert connect(loop, TENANT, calls).paused
        for transport in proxied + valid + others:
            transport.close()

    asyncio.run(scenario())


def test_past_the_bound_of_paused_connections_a_held_one_is_answered_at_once_a_waiting_one_read(limit):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        limit.max_held = 3
        for _ in range(2):
            connect(loop, TENANT, calls)
        waiting = [connect(loop, TENANT, calls) for _ in range(3)]
        assert limit.held == 3 and all(t.paused for t in waiting)
        assert not connect(loop, TENANT, calls).paused  # read: never turned away
        limit.refused(STRANGER)
        for _ in range(2):
            connect(loop, STRANGER, calls)
        at_once = connect(loop, STRANGER, calls)
        assert at_once.closed and at_once.written.startswith(b"HTTP/1.1 429 ")
        assert limit.held == 3

    asyncio.run(scenario())


def test_no_limit_when_set_to_zero():
    limit = ConnectionLimit(per_address=0, hold_s=5.0, max_held=10, exempt=lambda _: False)
    limit.refused(STRANGER)
    assert [limit.admit(STRANGER) for _ in range(100)] == [(None, READ)] * 100
    assert limit.read == {} and limit.refused_until == {}


def test_admit_says_wait_or_hold_past_the_limit(clock):
    limit = ConnectionLimit(per_address=1, hold_s=5.0, max_held=10, exempt=lambda _: False, clock=clock)
    assert limit.admit(STRANGER) == (STRANGER, READ)
    assert limit.admit(STRANGER) == (None, WAIT)
    limit.refused(STRANGER)
    assert limit.admit(STRANGER) == (None, HOLD)
    limit.authenticated(STRANGER)
    assert limit.admit(STRANGER) == (STRANGER, READ)


def test_a_key_the_cache_knows_to_be_refused_limits_its_address_before_the_app_runs(limit):
    usable_prefix, made_up = "a" * 10, "b" * 10
    auth._usable = (frozenset({usable_prefix}), time.monotonic() + 60)  # fresh (the fixture clears it)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        valid = connect(loop, TENANT, calls)
        valid.protocol.data_received(request(f"fg_{usable_prefix}_{'0' * 48}"))  # not sure to be refused
        assert limit.refused_until == {}
        wave = [connect(loop, STRANGER, calls) for _ in range(4)]
        for transport in wave[2:]:
            transport.protocol.data_received(request(f"fg_{made_up}_{'1' * 48}"))
        assert len(limit.waiting[STRANGER]) == 2
        wave[0].protocol.data_received(request(f"fg_{made_up}_{'1' * 48}"))
        assert STRANGER in limit.refused_until and STRANGER not in [c["client"][0] for c in calls]
        assert limit.waiting == {}  # marked from its headers, before the app: the waiting ones held
        wave[1].protocol.data_received(request(f"fg_{made_up}_{'2' * 48}"))
        assert [t.paused for t in wave] == [False, False, True, True]
        assert limit.read == {TENANT: 1, STRANGER: 2}

    asyncio.run(scenario())


@api_view("GET")
async def _authenticated(request):
    await auth.authenticate(request.headers.get("Authorization"))
    return json_response({})


urlpatterns = [path("v1/whoami", _authenticated)]


@pytest.mark.django_db(transaction=True)
def test_the_gateway_marks_the_address_of_a_valid_key_and_not_of_a_made_up_one(limit, settings):
    settings.ROOT_URLCONF = __name__
    tenant = Tenant.objects.create(slug="acme", name="acme", quota_share="0.5")
    full_key, prefix, secret_hash = key_generate()
    ApiKey.objects.create(tenant=tenant, default_class="BATCH", prefix=prefix, secret_hash=secret_hash)

    def get(peer: str, key: str) -> int:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/v1/whoami",
            "raw_path": b"/v1/whoami",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode())],
            "client": (peer, 50000),
            "server": ("testserver", 80),
        }
        sent: list[dict] = []
        done = asyncio.Event()
        asked = []

        async def receive():
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        async_to_sync(GatewayASGIHandler())(scope, receive, send)  # the ORM in this thread, as pytest-django wants
        return sent[0]["status"]

    assert get(STRANGER, "fg_bbbbbbbbbb_" + "1" * 48) == 401
    assert get(TENANT, full_key) == 200
    assert list(limit.good_until) == [TENANT]
    with pytest.raises(GatewayError):  # outside a request (no client address): nothing to mark
        async_to_sync(auth.authenticate)("Bearer fg_bbbbbbbbbb_" + "1" * 48)
    async_to_sync(auth.authenticate)(f"Bearer {full_key}")
    assert list(limit.good_until) == [TENANT]


def test_on_real_uvloop_sockets_a_paused_connections_first_read_is_neither_parsed_nor_lost(limit):
    """uvloop starts reading once connection_made returns, whatever it was told (its
    _call_connection_made calls _start_reading): the protocol pauses at that first read, keeps it
    for a waiting connection, and parses it only once the connection may be read."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls: list[dict] = []
        config = Config(app=app, http=HeaderTimeoutProtocol, lifespan="off", log_level="critical")
        config.load()
        state = ServerState()
        server = await loop.create_server(
            lambda: HeaderTimeoutProtocol(config=config, server_state=state, app_state={"calls": calls}),
            "127.0.0.1",
            0,
        )
        port = server.sockets[0].getsockname()[1]
        clients = []
        for key in ["fg_bbbbbbbbbb_" + "1" * 48] * 2 + [VALID] * 3:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request(key))
            await writer.drain()
            clients.append((reader, writer))
        await until(lambda: limit.held == 3, "three paused")
        waiting = list(limit.waiting["127.0.0.1"])
        await until(lambda: all(p.early for p in waiting) and len(calls) == 2, "their first reads in")
        assert all(p.early.startswith(b"POST ") and not p.made for p in waiting)  # read once, not parsed
        assert len(calls) == 2 and len(state.connections) == 2
        limit.authenticated("127.0.0.1")  # a valid key from it: the three are read
        answers = [await asyncio.wait_for(r.readline(), 30) for r, _ in clients[2:]]
        assert answers == [b"HTTP/1.1 204 No Content\r\n"] * 3 and len(calls) == 5
        for _, writer in clients:
            writer.close()
        server.close()

    uvloop.run(scenario())
