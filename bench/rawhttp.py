"""Just enough HTTP/1.1 on asyncio streams for load generation (keep-alive, chunked bodies).

A client library's connection pool costs more CPU than the server under test once thousands of
requests wait at once (httpx's pool scans its connections for every request); these few
functions keep the load generator cheap. Only what the gateway and the simulator send is
understood: Content-Length or chunked bodies, no 1xx, no trailers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

HEADER_END = b"\r\n\r\n"
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(frozen=True)
class Head:
    status: int
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"

    @property
    def chunked(self) -> bool:
        return self.headers.get("transfer-encoding", "").lower() == "chunked"


def split_url(base_url: str) -> tuple[str, int]:
    hostport = base_url.removeprefix("http://").split("/", 1)[0]
    host, _, port = hostport.partition(":")
    return host, int(port or 80)


def request_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str], method: str = "POST") -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_head(reader: asyncio.StreamReader) -> Head:
    raw = await reader.readuntil(HEADER_END)
    lines = raw.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return Head(int(lines[0].split(" ", 2)[1]), headers)


async def iter_body(reader: asyncio.StreamReader, head: Head) -> AsyncIterator[bytes]:
    """The body as it arrives (one piece per chunk when chunked)."""
    if "content-length" in head.headers:
        yield await reader.readexactly(int(head.headers["content-length"]))
    elif head.chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return
            yield data[:-2]
    else:
        yield await reader.read()


async def read_body(reader: asyncio.StreamReader, head: Head) -> bytes:
    return b"".join([piece async for piece in iter_body(reader, head)])


def error_code(status: int, body: bytes) -> str:
    """The OpenAI-shaped error's code, else the status."""
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return str(status)


class Pool:
    """Idle keep-alive connections to one server; a new one whenever none is idle, up to
    ``max_connections`` taken at once if given (past that, ``take`` waits for one given back)."""

    def __init__(self, base_url: str, *, max_connections: int | None = None) -> None:
        self.host, self.port = split_url(base_url)
        self.idle: list[Conn] = []
        self.opened = 0
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None

    async def take(self) -> Conn:
        if self._slots is not None:
            await self._slots.acquire()
        try:
            while self.idle:
                conn = self.idle.pop()
                if not conn[1].is_closing() and not conn[0].at_eof():
                    return conn
            conn = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        self.opened += 1
        return conn

    def give_back(self, conn: Conn, *, reusable: bool) -> None:
        if reusable and not conn[1].is_closing():
            self.idle.append(conn)
        else:
            conn[1].close()
        if self._slots is not None:
            self._slots.release()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
