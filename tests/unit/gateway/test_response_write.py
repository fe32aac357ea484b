"""How `manage.py serve`'s protocol writes a response: one that declares its Content-Length leaves in
one write (its head with the body's first part, also when the connection closes after it, and the
head alone for HEAD); one without (a stream) has its head written before its body is there, as
uvicorn does; a body in several parts writes the later parts as they come."""

from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.management.commands.serve import HeaderTimeoutProtocol
from tests.support.fake_transport import FakeTransport

BODY = b'{"ok": true}'
SIZED = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


def connect(app) -> FakeTransport:
    config = Config(app=app, http=HeaderTimeoutProtocol, lifespan="off", log_level="critical")
    config.load()
    protocol = HeaderTimeoutProtocol(config=config, server_state=ServerState(), app_state={})
    transport = FakeTransport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    return transport


def answer(*messages: dict):
    async def app(scope, receive, send):
        for message in messages:
            await send(message)

    return app


async def until(check) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.001)


def served(app, request: bytes) -> FakeTransport:
    async def scenario() -> FakeTransport:
        transport = connect(app)
        assert transport.protocol is not None
        transport.protocol.data_received(request)
        await until(lambda: transport.protocol.cycle is not None and transport.protocol.cycle.response_complete)
        await asyncio.sleep(0)
        return transport

    return asyncio.run(scenario())


GET = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"


def test_a_response_with_its_length_leaves_in_one_write_and_the_connection_stays_open():
    app = answer(
        {"type": "http.response.start", "status": 200, "headers": SIZED},
        {"type": "http.response.body", "body": BODY},
    )
    transport = served(app, GET)
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n" + BODY
    ]
    assert not transport.closed


def test_a_response_that_closes_the_connection_is_written_whole_before_the_close():
    app = answer(
        {"type": "http.response.start", "status": 413, "headers": [*SIZED, (b"connection", b"close")]},
        {"type": "http.response.body", "body": BODY},
    )
    transport = served(app, GET)
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 413 ")
    assert transport.writes[0].endswith(b"connection: close\r\n\r\n" + BODY)
    assert transport.closed


def test_a_head_request_gets_its_head_alone():
    app = answer(
        {"type": "http.response.start", "status": 200, "headers": SIZED},
        {"type": "http.response.body", "body": BODY},
    )
    transport = served(app, b"HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n"]


def test_a_body_in_parts_writes_the_later_parts_as_they_come():
    app = answer(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"6")]},
        {"type": "http.response.body", "body": b"abc", "more_body": True},
        {"type": "http.response.body", "body": b"def"},
    )
    transport = served(app, GET)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nabc", b"def"]


def test_a_stream_has_its_head_written_before_its_body_is_there():
    async def scenario() -> list[bytes]:
        go = asyncio.Event()

        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await go.wait()
            await send({"type": "http.response.body", "body": b"data: 1\n\n"})

        transport = connect(app)
        assert transport.protocol is not None
        transport.protocol.data_received(GET)
        await until(lambda: len(transport.writes) == 1)
        head = list(transport.writes)
        go.set()
        await until(lambda: transport.protocol.cycle.response_complete)
        assert transport.writes[1:] == [b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"]
        return head

    head = asyncio.run(scenario())
    assert head == [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"]
