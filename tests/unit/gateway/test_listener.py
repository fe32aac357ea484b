"""`manage.py serve`'s own accept (gateway.listener) on real sockets: a connection past the
per-address limit stays a raw socket with no transport and nothing read (its request still in
the kernel's receive queue), is read once it may be (a valid key from its address), or is held
and answered 429 if its address is refused; uvicorn's Server runs on it (its connections, its
graceful shutdown); a bounded number of accepts per callback."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios

import pytest
from uvicorn.config import Config
from uvicorn.server import Server, ServerState

from gateway import auth, connlimit, listener
from gateway.connlimit import HELD_ANSWER, ConnectionLimit
from gateway.management.commands.serve import HeaderTimeoutProtocol

REFUSED = "fg_bbbbbbbbbb_" + "1" * 48
VALID = "fg_vvvvvvvvvv_" + "0" * 48


def request(key: str) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
        + key.encode()
        + b"\r\ncontent-length: 2\r\n\r\n{}"
    )


async def app(scope, receive, send):
    """204 for VALID (its address marked as the gateway's handler does), 401 otherwise (its
    address marked refused)."""
    if scope["type"] != "http":
        return
    scope["state"].setdefault("calls", []).append(scope)
    authorization = dict(scope["headers"]).get(b"authorization", b"").decode()
    status = 204 if authorization == f"Bearer {VALID}" else 401
    if status == 204:
        connlimit.CLIENT.set(scope["client"][0])
        connlimit.key_accepted()
    else:
        connlimit.connection_limit().refused(scope["client"][0])
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def limit(settings):
    settings.FAIRGATE_TRUSTED_PROXIES = []
    settings.FAIRGATE_HEADER_TIMEOUT_MS = 60_000
    made = ConnectionLimit(per_address=2, hold_s=0.05, wait_s=600, max_held=1_000, jitter=lambda: 0.5)
    saved, connlimit._limit = connlimit._limit, made
    auth.cache_clear()
    yield made
    connlimit._limit = saved
    auth.cache_clear()


def unread(conn: socket.socket) -> int:
    """Bytes in a socket's receive queue (nothing read of them)."""
    return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


async def until(check) -> None:
    async with asyncio.timeout(30):
        while not check():
            await asyncio.sleep(0.005)


def served(calls: list[dict]):
    """A Listener on a fresh socket serving `app` with the gateway's protocol, and its server state."""
    config = Config(app=app, http=HeaderTimeoutProtocol, lifespan="off", log_level="critical")
    config.load()
    state = ServerState()
    sock = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.get_running_loop()
    made = listener.Listener(
        loop,
        sock,
        lambda: HeaderTimeoutProtocol(config=config, server_state=state, app_state={"calls": calls}, _loop=loop),
        100,
    )
    return made, state, sock.getsockname()[1]


async def send_all(port: int, keys: list[str]) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    clients = []
    for key in keys:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(key))
        await writer.drain()
        clients.append((reader, writer))
    return clients


def run(scenario) -> None:
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(scenario())


def test_past_the_limit_a_connection_is_a_raw_socket_unread_then_read_once_its_address_has_a_valid_key(limit):
    async def scenario() -> None:
        calls: list[dict] = []
        made, state, port = served(calls)
        first = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]  # read, silent so far
        clients = await send_all(port, [VALID] * 3)
        await until(lambda: limit.held == 3)
        parked = list(made.parked)
        assert len(parked) == 3 and all(unread(p.conn) == len(request(VALID)) for p in parked)
        assert len(state.connections) == 2 and not calls
        first[0][1].write(request(VALID))  # a valid key from the address: the three are read
        answers = [await asyncio.wait_for(r.readline(), 30) for r, _ in [first[0], *clients]]
        assert answers == [b"HTTP/1.1 204 No Content\r\n"] * 4 and len(calls) == 4
        clients += first
        assert limit.held == 0 and not made.parked and not limit.waiting
        for _, writer in clients:
            writer.close()
        made.close()
        await made.wait_closed()

    run(scenario)


def test_connections_waiting_when_their_address_is_refused_are_held_unread_then_answered_429(limit):
    async def scenario() -> None:
        calls: list[dict] = []
        made, state, port = served(calls)
        clients = await send_all(port, [REFUSED] * 6)
        answers = [await asyncio.wait_for(r.read(), 30) for r, _ in clients]
        assert [a.split(b"\r\n")[0] for a in answers[:2]] == [b"HTTP/1.1 401 Unauthorized"] * 2
        assert answers[2:] == [HELD_ANSWER] * 4  # never parsed: the app saw two requests
        assert len(calls) == 2 and limit.held == 0 and not made.parked
        made.close()

    run(scenario)


def test_a_parked_connection_is_closed_when_the_listener_closes_and_gives_its_place_back(limit):
    async def scenario() -> None:
        made, state, port = served([])
        sleepy = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]  # read, say nothing
        clients = await send_all(port, [VALID])
        await until(lambda: limit.held == 1)
        made.close()
        assert await asyncio.wait_for(clients[0][0].read(), 30) == b""
        assert limit.held == 0 and not limit.waiting and made.sock.fileno() == -1
        for _, writer in sleepy:
            writer.close()

    run(scenario)


def test_each_callback_accepts_a_bounded_number_of_connections(limit, monkeypatch):
    monkeypatch.setattr(listener, "ACCEPTS_PER_CALLBACK", 3)

    async def scenario() -> None:
        made, state, port = served([])
        accepted: list[int] = []
        admit = made._admit

        def counting(conn, address):
            accepted[-1] += 1
            admit(conn, address)

        def accept():
            accepted.append(0)
            listener.Listener._accept(made)

        made._admit = counting  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        loop.remove_reader(made.sock.fileno())
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        loop.add_reader(made.sock.fileno(), accept)
        await until(lambda: sum(accepted) == 8)
        assert max(accepted) == 3 and len(accepted) >= 3
        for client in clients:
            client.close()
        made.close()

    run(scenario)


def test_uvicorns_server_serves_on_the_accepting_loop_and_shuts_down_gracefully(limit):
    """serve's way: Server.run with our socket on gateway.listener's loop."""
    loop_factory = "gateway.listener:new_event_loop"
    config = Config(app=app, http=HeaderTimeoutProtocol, lifespan="off", log_level="critical", loop=loop_factory)
    server = Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    seen: dict[str, object] = {}

    async def client() -> None:
        await until(lambda: server.started)
        seen["listener"] = type(server.servers[0])
        clients = await send_all(port, [VALID] * 3)
        seen["answers"] = [await asyncio.wait_for(r.readline(), 30) for r, _ in clients]
        seen["connections"] = len(server.server_state.connections)  # kept alive: still the server's
        server.should_exit = True

    async def both() -> None:
        task = asyncio.create_task(client())
        await server.serve(sockets=[sock])
        await task
        seen["after"] = len(server.server_state.connections)

    loop = listener.new_event_loop()
    try:
        loop.run_until_complete(both())
    finally:
        loop.close()
    assert seen == {
        "listener": listener.Listener,
        "answers": [b"HTTP/1.1 204 No Content\r\n"] * 3,
        "connections": 3,
        "after": 0,
    }
