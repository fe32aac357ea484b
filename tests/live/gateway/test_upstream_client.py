"""The gateway's HTTP/1.1 client against tiny scripted servers (no Django)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream import Pool, UpstreamError


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return head + await reader.readexactly(length)


def _run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), 10))


async def _serve(answer):
    """Start a server; ``answer(request_bytes, n)`` returns bytes to send, or None to close."""
    connections = []

    async def handle(reader, writer):
        connections.append(writer)
        n = 0
        try:
            while True:
                request = await _read_request(reader)
                n += 1
                reply = answer(request, n)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, connections


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


def test_keep_alive_connection_is_reused_and_the_path_joined():
    async def scenario():
        seen = []
        server, port, connections = await _serve(lambda req, n: seen.append(req) or _ok(b'{"n": %d}' % n))
        pool = Pool(f"http://127.0.0.1:{port}/v1", connect_timeout_s=2, read_timeout_s=2)
        for expected in (b'{"n": 1}', b'{"n": 2}'):
            response = await pool.post("/chat/completions", b"{}", {"X-Request-Id": "r1"})
            assert response.status_code == 200 and response.headers.get("content-type") == "application/json"
            assert await response.aread() == expected
            await response.aclose()
        assert len(connections) == 1
        assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and b"X-Request-Id: r1" in seen[0]
        pool.close()
        server.close()

    _run(scenario)


def test_a_connection_closed_while_idle_is_replaced_once():
    async def scenario():
        server, port, connections = await _serve(lambda req, n: _ok(b"{}") if n == 1 else None)
        pool = Pool(f"http://127.0.0.1:{port}", connect_timeout_s=2, read_timeout_s=2)
        for _ in range(3):
            response = await pool.post("/x", b"{}", {})
            assert await response.aread() == b"{}"
            await response.aclose()
        assert len(connections) >= 2  # the server answers once per connection
        pool.close()
        server.close()

    _run(scenario)


def test_chunked_stream_arrives_in_pieces():
    async def scenario():
        def answer(req, n):
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

        server, port, _ = await _serve(answer)
        pool = Pool(f"http://127.0.0.1:{port}", connect_timeout_s=2, read_timeout_s=2)
        response = await pool.post("/s", b"{}", {})
        assert b"".join([c async for c in response.aiter_raw()]) == b"hello world"
        await response.aclose()
        pool.close()
        server.close()

    _run(scenario)


def test_body_delimited_by_connection_close():
    async def scenario():
        server, port, _ = await _serve(lambda req, n: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof")
        pool = Pool(f"http://127.0.0.1:{port}", connect_timeout_s=2, read_timeout_s=2)
        response = await pool.post("/s", b"{}", {})
        assert await response.aread() == b"until eof"
        await response.aclose()
        assert not pool._idle  # not reusable
        pool.close()
        server.close()

    _run(scenario)


@pytest.mark.parametrize(
    "answer, kind",
    [
        (lambda req, n: None, "read"),  # closes without answering
        (lambda req, n: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "read"),  # cut mid-body
    ],
)
def test_broken_answers_raise_upstream_errors(answer, kind):
    async def scenario():
        server, port, _ = await _serve(answer)
        pool = Pool(f"http://127.0.0.1:{port}", connect_timeout_s=2, read_timeout_s=0.5)
        with pytest.raises(UpstreamError) as err:
            response = await pool.post("/s", b"{}", {})
            await response.aread()
        assert err.value.kind in (kind, "timeout")
        pool.close()
        server.close()

    _run(scenario)


def test_refused_connection_and_silent_backend():
    async def scenario():
        pool = Pool("http://127.0.0.1:1", connect_timeout_s=1, read_timeout_s=1)
        with pytest.raises(UpstreamError) as err:
            await pool.post("/s", b"{}", {})
        assert err.value.kind == "connect"

        async def silent(reader, writer):
            await asyncio.sleep(5)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"http://127.0.0.1:{port}", connect_timeout_s=1, read_timeout_s=0.2)
        with pytest.raises(UpstreamError) as err:
            await pool.post("/s", b"{}", {})
        assert err.value.kind == "timeout"
        server.close()

    _run(scenario)
