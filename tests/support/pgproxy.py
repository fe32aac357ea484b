"""A TCP forwarder to PostgreSQL that a test can cut and restore: a database outage without
stopping the shared server.

`PgProxy` listens on a local port of its own and pipes every connection to the real server. While
cut, every piped connection is reset and every new one is reset at once (the client sees
"server closed the connection unexpectedly", as when the server dies); restored, it pipes again
on the same port, so the client's DATABASE_URL stays valid. It runs its own event loop in a
daemon thread of the test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

CHUNK_BYTES = 65536
LOOP_TIMEOUT_S = 5.0


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


class PgProxy:
    """``127.0.0.1:<port>`` → ``target``; `cut` and `restore` switch the outage on and off."""

    def __init__(self, target_host: str = "127.0.0.1", target_port: int = 5432) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.down = False
        self._links: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pgproxy", daemon=True)
        self._server: asyncio.Server | None = None

    @classmethod
    def for_url(cls, database_url: str) -> PgProxy:
        """A proxy to the server of ``database_url``."""
        parts = urlsplit(database_url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def start(self) -> PgProxy:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url_through(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by this proxy's."""
        parts = urlsplit(database_url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def cut(self) -> None:
        """From now on every connection is reset: those open now and those still to come."""
        self._run(self._cut())

    def restore(self) -> None:
        self._run(self._restore())

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.restore()

    def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            self._run(self._server.wait_closed())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(LOOP_TIMEOUT_S)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(LOOP_TIMEOUT_S)

    async def _cut(self) -> None:
        self.down = True
        for writer in list(self._links):
            _reset(writer)
        self._links.clear()

    async def _restore(self) -> None:
        self.down = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        if self.down:  # cut while connecting
            _reset(writer)
            _reset(up_writer)
            return
        pair = {writer, up_writer}
        self._links |= pair
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._links -= pair
