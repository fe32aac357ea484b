"""`manage.py serve`'s listening sockets, accepted by this code rather than by the event loop's
server, so that gateway.connlimit sees a connection's address before the loop reads from it. A
connection that may be read is handed to the loop (`connect_accepted_socket`); one past the limit
stays a raw socket, with no transport and nothing read, until it may be read (or is answered 429
and closed). A bounded number of accepts per callback keeps the loop fair to other sockets. Why
and the figures: bench/REPORT-adversarial.md, issue 44 item 6."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from gateway.connlimit import HELD_ANSWER, READ, WAIT, connection_limit

ACCEPTS_PER_CALLBACK = 16
ACCEPT_RETRY_S = 0.1  # out of file descriptors: accept again after this
DRAIN_BYTES = 256 * 1024  # what a held connection's request may fill before its 429 (the rest is reset)
logger = logging.getLogger("gateway.listener")


class Listener:
    """Accepts on ``sock`` and serves with ``protocol_factory``: what uvicorn's Server needs of an
    asyncio.Server (close, wait_closed, sockets)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        backlog: int,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = protocol_factory
        self.parked: dict[Parked, None] = {}
        self.serving: set[asyncio.Task[Any]] = set()
        self.closed = False
        sock.listen(backlog)
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self.sock,)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_CALLBACK):
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                logger.warning("accept failed (%s): accepting again in %.1f s", exc, ACCEPT_RETRY_S)
                self.loop.remove_reader(self.sock.fileno())
                self.loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)
                return
            self._admit(conn, peer[0] if isinstance(peer, tuple) and peer else None)

    def _resume_accepting(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def _admit(self, conn: socket.socket, address: str | None) -> None:
        limit = connection_limit()
        counted, verdict = limit.admit(address)
        if verdict == READ:
            self.serve(conn, counted)
            return
        parked = Parked(self, conn, address)
        if verdict == WAIT:
            parked.wait(limit.wait_for())
        else:
            parked.hold(limit.hold_for())

    def serve(self, conn: socket.socket, counted: str | None) -> None:
        """Hands ``conn`` to the loop, its protocol told the address it is counted under."""

        def made() -> asyncio.Protocol:
            protocol = self.factory()
            accepted = getattr(protocol, "accepted", None)
            if accepted is not None:
                accepted(counted)
            return protocol

        task = self.loop.create_task(self.loop.connect_accepted_socket(made, conn))
        self.serving.add(task)
        task.add_done_callback(self._served)

    def _served(self, task: asyncio.Task[Any]) -> None:
        self.serving.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a connection could not be served: %s", task.exception())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for parked in list(self.parked):
            parked.drop()

    async def wait_closed(self) -> None:
        if self.serving:
            await asyncio.gather(*self.serving, return_exceptions=True)


class Parked:
    """An accepted connection past the limit: a raw socket, nothing read, no reader registered.
    Waits (gateway.connlimit's Waiter) or is held, then answered 429."""

    __slots__ = ("address", "conn", "listener", "rehold", "timer", "waiting")

    def __init__(self, listener: Listener, conn: socket.socket, address: str | None) -> None:
        self.listener = listener
        self.conn = conn
        self.address = address
        self.timer: asyncio.TimerHandle | None = None
        self.waiting = False
        self.rehold = False  # its address was refused while it waited: held when its wait is over

    def wait(self, for_s: float) -> None:
        self._park(for_s, self._wait_over)
        self.waiting = True
        connection_limit().wait(self.address, self)  # type: ignore[arg-type]

    def hold(self, for_s: float) -> None:
        if for_s <= 0:
            self._answer()
            return
        self._park(for_s, self._hold_over)

    def _park(self, for_s: float, then: Callable[[], None]) -> None:
        connection_limit().held += 1
        self.listener.parked[self] = None
        self.timer = self.listener.loop.call_later(for_s, then)

    def _unpark(self) -> None:
        limit = connection_limit()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            limit.held -= 1
        self.listener.parked.pop(self, None)
        if self.waiting:
            self.waiting = False
            limit.unwait(self.address, self)  # type: ignore[arg-type]

    def resume(self, address: str) -> None:
        """gateway.connlimit: may be read now, counted under ``address``."""
        self._unpark()
        self.listener.loop.call_soon(self.listener.serve, self.conn, address)

    def refused(self) -> None:
        """gateway.connlimit: its address was refused a key (the limit has let it go)."""
        self.waiting = False
        self.rehold = True

    def _wait_over(self) -> None:
        rehold = self.rehold
        self._unpark()
        if not rehold:
            counted, verdict = connection_limit().waited(self.address)  # type: ignore[arg-type]
            if verdict == READ:
                self.listener.serve(self.conn, counted)
                return
        self.hold(connection_limit().hold_for())

    def _hold_over(self) -> None:
        self._unpark()
        self._answer()

    def _answer(self) -> None:
        """429 and close."""
        self._close(HELD_ANSWER)

    def drop(self) -> None:
        """The listener is closing: closed unanswered."""
        self._unpark()
        self._close(b"")

    def _close(self, answer: bytes) -> None:
        """What it sent read and dropped first, so that the close is not a reset."""
        conn = self.conn
        try:
            conn.setblocking(False)
            drained = 0
            while drained < DRAIN_BYTES and (chunk := conn.recv(65536)):
                drained += len(chunk)
        except OSError:
            pass
        try:
            if answer:
                conn.send(answer)
        except OSError:
            pass
        conn.close()


class _Accepting:
    """An event loop whose `create_server` on a given socket returns a Listener."""

    async def create_server(self, protocol_factory, host=None, port=None, *, sock=None, ssl=None, backlog=100, **kw):
        if sock is None or ssl is not None:
            return await super().create_server(  # type: ignore[misc]
                protocol_factory, host, port, sock=sock, ssl=ssl, backlog=backlog, **kw
            )
        return Listener(self, sock, protocol_factory, backlog)  # type: ignore[arg-type]


class AcceptingSelectorLoop(_Accepting, asyncio.SelectorEventLoop):
    pass


try:
    import uvloop
except ImportError:  # pragma: no cover -- uvicorn[standard] installs it
    uvloop = None  # type: ignore[assignment]
else:

    class AcceptingUvloop(_Accepting, uvloop.Loop):  # type: ignore[misc]
        pass


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop (asyncio's without it), with `create_server` as above: uvicorn's ``loop``."""
    return AcceptingUvloop() if uvloop is not None else AcceptingSelectorLoop()
