"""`manage.py serve`: the production ASGI server (uvicorn) for the whole app.

uvicorn, not daphne: it speaks the ASGI lifespan protocol (so the embedded dispatcher starts and
stops with the process), it is the faster HTTP server of the two (httptools + uvloop), and it serves
WebSockets for Channels as well. One process, the dispatcher's queues in it; or, with the shared
scheduler (``FAIRGATE_SCHEDULER=shared``), ``--workers N`` gateway processes on one port sharing
one queue through Redis (gateway.shared).
"""

from __future__ import annotations

import asyncio
import importlib.util

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from gateway.connlimit import HELD_ANSWER, READ, WAIT, connection_limit
from gateway.metrics import multiprocess_prepare

REQUEST_TIMEOUT = STATUS_LINE[408] + b"content-length: 0\r\nconnection: close\r\n\r\n"


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's headers.

    uvicorn times only the idle gap between requests (``timeout_keep_alive``, which stops at the
    next request's first byte) and nothing on a fresh connection, so a client sending its headers
    a byte at a time held a connection for as long as it liked. Here a request's headers must be
    complete within FAIRGATE_HEADER_TIMEOUT_MS of the connection being read (the first request) or
    of the request's first byte (later ones on a keep-alive connection); if not, the client gets a
    408 and the connection is closed. This covers every path (API, console, admin, WebSocket
    handshakes); the body's deadline is the gateway handler's (FAIRGATE_BODY_TIMEOUT_MS).

    Before any of that, the per-address limit (gateway.connlimit): a connection past it is paused
    at its accept, before uvicorn's own set-up (a parser, flow control, its place in the server's
    connections), until it may be read (a place, a valid key from its address, or its wait over),
    or held, then answered 429 and closed, if its address was refused a key. A connection read is
    checked again before its first request is parsed (the flood's first wave comes in before the
    first refusal). An intake POST whose key the cache already knows to be refused limits its
    address as soon as its headers are parsed, before the app refuses it.
    """

    header_timer: asyncio.TimerHandle | None = None
    address: str | None = None  # the peer's
    counted: str | None = None  # the address this connection counts under (gateway.connlimit)
    begun = False  # a request has begun on it (the limit is checked before the first only)
    made = False  # uvicorn's set-up has run: the connection is being read
    lost = False
    paused: asyncio.TimerHandle | None = None  # not read: when its wait or hold is over
    waiting = False  # paused until it may be read; else held (then answered 429)
    rehold = False  # was waiting when its address was refused (what it sent dropped): held anew when its wait is over
    early = b""  # what uvloop read of a waiting connection before it was paused

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        self._made_with = (config, server_state, app_state)  # uvicorn's set-up waits until it is read
        self.loop = _loop or asyncio.get_event_loop()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) and peer else None
        limit = connection_limit()
        self.counted, verdict = limit.admit(self.address)
        if verdict == READ:
            self._read()
        elif verdict == WAIT:
            self._pause(limit.wait_for(), waiting=True)
        else:
            self._pause(limit.hold_for())

    def _read(self) -> None:
        """uvicorn's set-up, deferred from __init__ and connection_made."""
        transport = self.transport
        super().__init__(*self._made_with, _loop=self.loop)
        super().connection_made(transport)
        self.made = True
        self._header_timer_start()

    def data_received(self, data: bytes) -> None:
        if self.paused is not None or not self.made:
            # Not read: uvloop starts reading after connection_made whatever it was told, so one
            # read comes in; a waiting connection keeps it for when it is read.
            self.transport.pause_reading()
            if not self.made and (self.waiting or self.paused is None):
                self.early += data
            return
        if not self.begun and self.counted is not None and not connection_limit().may_parse(self.counted):
            counted, self.counted = self.counted, None
            connection_limit().closed(counted)
            self._header_timer_stop()
            self._pause(connection_limit().hold_for())
            return
        self.begun = True
        super().data_received(data)
        if self.counted is not None and self.transport.get_protocol() is not self:  # upgraded to a WebSocket
            counted, self.counted = self.counted, None
            connection_limit().closed(counted)  # whose protocol is not this one: it gives its place back now

    def _pause(self, for_s: float, *, waiting: bool = False) -> None:
        """Reads no more of this connection for ``for_s`` (0: answers 429 and closes it now)."""
        self.transport.pause_reading()
        if for_s <= 0:
            self._answer_held()
            return
        limit = connection_limit()
        limit.held += 1
        self.waiting = waiting
        if waiting:
            limit.wait(self.address, self)  # type: ignore[arg-type]
        self.paused = self.loop.call_later(for_s, self._pause_over)

    def _unpause(self) -> None:
        limit = connection_limit()
        if self.paused is not None:
            self.paused.cancel()
            self.paused = None
            limit.held -= 1
        if self.waiting:
            self.waiting = False
            limit.unwait(self.address, self)  # type: ignore[arg-type]

    def _pause_over(self) -> None:
        waited, rehold = self.waiting, self.rehold
        self._unpause()
        if waited:
            self.counted, verdict = connection_limit().waited(self.address)  # type: ignore[arg-type]
            if verdict == READ:
                self._resumed()
                return
        elif not rehold:
            self._answer_held()
            return
        self.rehold = False
        self.early = b""
        self._pause(connection_limit().hold_for())

    def resume(self, address: str) -> None:
        """gateway.connlimit: this waiting connection may be read now, counted under ``address``."""
        self.counted = address
        self._unpause()
        self.loop.call_soon(self._resumed)  # not inside the caller (another connection's end, a key check)

    def refused(self) -> None:
        """gateway.connlimit: this waiting connection's address was refused a key: it is held."""
        self.waiting = False  # (the limit has let it go)
        self.rehold = True
        self.early = b""

    def _resumed(self) -> None:
        if self.lost or self.made:
            return
        self._read()
        early, self.early = self.early, b""
        self.transport.resume_reading()
        if early:
            self.data_received(early)

    def _answer_held(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(HELD_ANSWER)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_timer_start()  # the first request's runs from the connection, already started

    def _start_asgi_task(self, cycle: RequestResponseCycle, app) -> None:
        super()._start_asgi_task(cycle, _Joined(cycle, app))

    def on_headers_complete(self) -> None:
        self._header_timer_stop()
        super().on_headers_complete()
        if self.counted is not None and _key_refused(self.scope):
            connection_limit().refused(self.counted)  # now: the flood's next connections are held unparsed

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._unpause()
        if self.counted is not None:
            counted, self.counted = self.counted, None
            connection_limit().closed(counted)
        if not self.made:  # never read: uvicorn never knew it
            return
        self._header_timer_stop()
        super().connection_lost(exc)

    def _header_timer_start(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(settings.FAIRGATE_HEADER_TIMEOUT_MS / 1000, self._headers_late)

    def _header_timer_stop(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        """The headers are still incomplete: close the connection, after a 408 if a request had
        begun (a silent connection gets none) and no earlier response is still being sent on it."""
        self.header_timer = None
        if self.transport.is_closing():
            return
        if self.scope is not None and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()


class _Joined:
    """``app`` for one request cycle, whose response head (status line and headers) is held while
    it declares a Content-Length and written with the first body message: one write, one segment
    to the client. While held, the cycle writes to this object instead of its transport."""

    __slots__ = ("app", "closing", "cycle", "parts", "transport")

    def __init__(self, cycle: RequestResponseCycle, app) -> None:
        self.app = app
        self.cycle = cycle
        self.transport = cycle.transport
        self.parts: list[bytes] | None = None
        self.closing = False

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, receive, self.send)
        finally:
            self.flush()

    async def send(self, message) -> None:
        cycle = self.cycle
        if message["type"] == "http.response.start" and not cycle.response_started and _sized(message):
            self.parts = []
            cycle.transport = self  # type: ignore[assignment]  # write and close are held here
            try:
                await cycle.send(message)
            except BaseException:
                self.flush()
                raise
            return
        try:
            await cycle.send(message)
        finally:
            self.flush()

    def write(self, data: bytes) -> None:
        if self.parts is None:
            self.transport.write(data)
        else:
            self.parts.append(data)

    def close(self) -> None:
        if self.parts is None:
            self.transport.close()
        else:
            self.closing = True

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def flush(self) -> None:
        if self.parts is None:
            return
        parts, self.parts = self.parts, None
        self.cycle.transport = self.transport
        if parts and not self.cycle.disconnected:
            self.transport.write(b"".join(parts))
        if self.closing:
            self.transport.close()


def _sized(message) -> bool:
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


def _key_refused(scope) -> bool:
    """Whether an intake POST's key is sure to be refused (from the key cache alone)."""
    # Here, not at the top: see _credentials_check.
    from gateway.auth import refused_from_cache  # noqa: PLC0415 -- see above
    from gateway.intake import INTAKE_PATHS  # noqa: PLC0415 -- see above

    if scope.get("method") != "POST" or scope.get("path") not in INTAKE_PATHS:
        return False
    authorization = next((v.decode("latin-1") for n, v in scope["headers"] if n == b"authorization"), None)
    return refused_from_cache(authorization)


class Command(BaseCommand):
    help = "Serve Fairgate (gateway, dispatcher, console, admin) with uvicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--log-level", default="warning")
        parser.add_argument(
            "--workers",
            type=int,
            default=1,
            help="gateway processes on the one port (more than one needs FAIRGATE_SCHEDULER=shared)",
        )

    def handle(self, *args, host: str, port: int, log_level: str, workers: int, **opts):
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if workers > 1 and settings.FAIRGATE_SCHEDULER != "shared":
            raise CommandError(
                "--workers above 1 needs FAIRGATE_SCHEDULER=shared (and REDIS_URL): with the embedded "
                "scheduler each process would keep queues and backend slots of its own"
            )
        _credentials_check()
        if workers > 1:  # every process's metrics, summed at each scrape (gateway.metrics)
            multiprocess_prepare(settings.VAR_DIR, port=port)
        self.stdout.write(
            f"Fairgate on http://{host}:{port}/ (OpenAI API at /v1/, admin at /admin/)"
            + (f", {workers} gateway processes" if workers > 1 else "")
        )
        self.stdout.flush()
        uvicorn.run(
            "config.asgi:application",
            host=host,
            port=port,
            log_level=log_level,
            http=HeaderTimeoutProtocol,  # httptools (uvicorn[standard]) with a header deadline
            loop="uvloop" if _installed("uvloop") else "asyncio",
            proxy_headers=False,  # X-Forwarded-For is trusted only from FAIRGATE_TRUSTED_PROXIES, by the gateway
            server_header=False,
            access_log=False,
            lifespan="on",
            backlog=4096,
            timeout_keep_alive=30,
            workers=workers if workers > 1 else None,  # uvicorn's supervisor: one socket, N processes
        )


def _credentials_check() -> None:
    """Refuse to start when an enabled backend names an environment variable that is not set."""
    # Here, not at the top: `serve --workers N` spawns processes that import this module (for its
    # protocol class) before Django is set up, and these import models.
    from django.db import DatabaseError  # noqa: PLC0415 -- see above

    from scheduling.selectors import backend_specs  # noqa: PLC0415 -- see above
    from scheduling.upstreams import missing_env  # noqa: PLC0415 -- see above

    try:
        missing = missing_env(backend_specs())
    except DatabaseError:  # not migrated yet, or down: /readyz says so
        return
    if missing:
        raise CommandError("; ".join(str(problem) for problem in missing))
