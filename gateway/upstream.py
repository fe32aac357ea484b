"""A lean HTTP/1.1 client for backends: asyncio streams, the httptools parser, keep-alive pools.

Why not httpx: profiling the gateway at 200 requests/s showed about half of its CPU time in
httpx/httpcore (its pool re-checks every idle connection, with a poll() per connection, on
every request). The gateway needs little: POST a JSON body, read status and headers, then the
body at once or as it arrives. One pool per backend address keeps idle connections (LIFO, at
most ``max_idle``, dropped after ``idle_s``); a reused connection that turns out to be closed
before any byte of the answer is retried once on a fresh one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

READ_BYTES = 65536


class UpstreamError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # "connect" | "timeout" | "read"


class Headers:
    """Response headers: lower-case names, in order, duplicates kept."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        return next((v for k, v in self._items if k == name), default)

    def multi_items(self) -> list[tuple[str, str]]:
        return list(self._items)


class _Parsed:
    """httptools callbacks: status, headers, body chunks, completion."""

    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []
        self.headers_done = False
        self.complete = False
        self.body: list[bytes] = []
        self.keep_alive = False
        # set right after the parser is made: llhttp answers keep-alive only here
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        assert self.parser is not None  # set before the parser is fed, dropped only here
        self.keep_alive = self.parser.should_keep_alive()
        self.parser = None  # the parser refers to us: drop the cycle, so both go by refcount, not the collector


class _Connection:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now_s: float, idle_s: float) -> bool:
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and not self.reader._buffer  # type: ignore[attr-defined]  # private, not in typeshed  # noqa: SLF001
            and now_s - self.idle_since < idle_s
        )

    def close(self) -> None:
        self.writer.close()


class UpstreamResponse:
    def __init__(self, pool: Pool, conn: _Connection, parser, parsed: _Parsed, read_timeout_s: float) -> None:
        self.status_code = parser.get_status_code()
        self.headers = Headers(parsed.headers)
        self._pool = pool
        self._conn: _Connection | None = conn
        self._parser = parser
        self._parsed = parsed
        self._read_timeout_s = read_timeout_s
        self._keep = True

    async def _more(self, conn: _Connection) -> None:
        try:
            async with asyncio.timeout(self._read_timeout_s):
                data = await conn.reader.read(READ_BYTES)
        except TimeoutError:
            raise UpstreamError("timeout", "no data from the backend in time") from None
        except OSError as exc:
            raise UpstreamError("read", f"{type(exc).__name__}: {exc}") from None
        if not data:
            if not self._length_known():
                self._parsed.complete = True  # the body ends with the connection
                self._keep = False
                return
            raise UpstreamError("read", "the backend closed the connection mid-answer")
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise UpstreamError("read", f"malformed answer: {exc}") from None

    def _length_known(self) -> bool:
        return self.headers.get("content-length") is not None or "chunked" in (
            self.headers.get("transfer-encoding") or ""
        )

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        parsed = self._parsed
        while True:
            if parsed.body:
                chunk = b"".join(parsed.body)
                parsed.body.clear()
                yield chunk
            conn = self._conn
            if parsed.complete or conn is None:
                return
            await self._more(conn)

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reusable = self._parsed.complete and self._keep and self._parsed.keep_alive
        self._pool.release(conn, reusable=reusable)


class Pool:
    """Keep-alive connections to one backend address."""

    def __init__(
        self, url: str, *, connect_timeout_s: float, read_timeout_s: float, max_idle: int = 64, idle_s: float = 20.0
    ) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.base_path = parts.path.rstrip("/")
        host_header = self.host if parts.port is None else f"{self.host}:{self.port}"
        self._host_header = host_header.encode("latin-1")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._idle: deque[_Connection] = deque()
        self._ssl = ssl.create_default_context() if self.tls else None
        self.closed = False

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self._ssl, server_hostname=self.host if self.tls else None
                )
        except TimeoutError:
            raise UpstreamError("timeout", f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise UpstreamError("connect", f"{self.host}:{self.port}: {exc}") from None
        return _Connection(reader, writer)

    def _take_idle(self) -> _Connection | None:
        now_s = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(now_s, self.idle_s):
                return conn
            conn.close()
        return None

    def release(self, conn: _Connection, *, reusable: bool) -> None:
        if reusable and not self.closed and len(self._idle) < self.max_idle:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.close()

    def _request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [
            b"POST " + (self.base_path + path).encode("latin-1") + b" HTTP/1.1",
            b"Host: " + self._host_header,
            b"Content-Length: " + str(len(body)).encode(),
        ]
        lines += [f"{name}: {value}".encode("latin-1") for name, value in headers.items()]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Send; return once status and headers are in (the body is read from the response)."""
        payload = self._request_bytes(path, body, headers)
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, payload)
            except _StaleConnection:
                pass  # closed by the backend while idle: once more on a new connection
        conn = await self._connect()
        try:
            return await self._exchange(conn, payload)
        except _StaleConnection:
            raise UpstreamError("read", "the backend closed the connection before answering") from None

    async def _exchange(self, conn: _Connection, payload: bytes) -> UpstreamResponse:
        parsed = _Parsed()
        parser = httptools.HttpResponseParser(parsed)
        parsed.parser = parser
        try:
            conn.writer.write(payload)
            async with asyncio.timeout(self.read_timeout_s):
                await conn.writer.drain()
                while not parsed.headers_done:
                    data = await conn.reader.read(READ_BYTES)
                    if not data:
                        conn.close()
                        raise _StaleConnection()
                    parser.feed_data(data)
        except TimeoutError:
            conn.close()
            raise UpstreamError("timeout", "the backend did not answer in time") from None
        except (ConnectionResetError, BrokenPipeError):
            conn.close()
            raise _StaleConnection() from None
        except (OSError, httptools.HttpParserError) as exc:
            conn.close()
            raise UpstreamError("read", f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return UpstreamResponse(self, conn, parser, parsed, self.read_timeout_s)

    def close(self) -> None:
        self.closed = True
        while self._idle:
            self._idle.pop().close()


class _StaleConnection(Exception):
    pass
