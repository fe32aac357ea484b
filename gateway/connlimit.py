"""Connections per client address, counted where `manage.py serve` accepts them. An address that
has not presented a valid key in the last GOOD_KEEP_S has at most FAIRGATE_CONNECTIONS_PER_ADDRESS
connections read at once. One more is paused at its accept, before uvicorn's protocol is set up:
it waits for a place, or for a valid key from its address (then all its waiting connections are
read and the address is not limited), at most about WAIT_S (then it is read anyway); if its
address is refused a key (401) meanwhile or was lately, it is held instead, about
FAIRGATE_AUTH_TARPIT_MS, answered 429 and closed. A peer in FAIRGATE_TRUSTED_PROXIES is never
limited here (its clients are the proxy's to limit). Why and the figures: docs/money.md, "Refused
before it costs anything"; bench/REPORT-adversarial.md."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol

from django.conf import settings

from gateway.clientip import proxy_trusted

HELD_ANSWER = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
    b"connection: close\r\ncontent-length: 113\r\n\r\n"
    b'{"error": {"message": "Too many connections from your address.", "type": "rate_limit", '
    b'"code": "too_many_connections"}}'
)
REFUSED_KEEP_S = 30.0  # how long a 401 keeps its address limited
GOOD_KEEP_S = 600.0  # how long a valid key keeps its address unlimited
WAIT_S = 1.0  # how long (0.5-1.5x) a connection past the limit waits for a place before it is read anyway
ADDRESSES_MAX = 100_000  # addresses remembered (refused, and with a valid key), the oldest forgotten first
READ, WAIT, HOLD = "read", "wait", "hold"  # what `admit` says of a new connection
CLIENT: ContextVar[str | None] = ContextVar("fairgate_client_address", default=None)  # the request's peer


class Waiter(Protocol):
    def resume(self, address: str) -> None:
        """May be read now, counted under ``address``."""

    def refused(self) -> None:
        """Its address was refused a key: held from now on."""


class ConnectionLimit:
    """Counts the connections being read per address. An address without a valid key lately has
    ``per_address`` at most (0: no limit); past that a connection waits (``wait_s`` 0.5-1.5x), or is
    held (``hold_s`` 0.5-1.5x) if the address was refused lately; at most ``max_held`` paused."""

    def __init__(
        self,
        *,
        per_address: int,
        hold_s: float,
        max_held: int,
        wait_s: float = WAIT_S,
        exempt: Callable[[str], bool] = proxy_trusted,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.per_address = per_address
        self.hold_s = hold_s
        self.wait_s = wait_s
        self.max_held = max_held
        self.read: dict[str, int] = {}
        self.refused_until: dict[str, float] = {}  # address → until when it is limited, oldest first
        self.good_until: dict[str, float] = {}  # address → until when it is not limited, oldest first
        self.waiting: dict[str, dict[Waiter, None]] = {}  # address → its waiting connections, oldest first
        self.held = 0  # connections paused (waiting or held)
        self._exempt = exempt
        self._clock = clock
        self._jitter = jitter

    def refused(self, address: str | None) -> None:
        """``address`` was refused a key: limited for REFUSED_KEEP_S from now (unless it presented a
        valid key lately)."""
        if not address or self.per_address <= 0 or self._exempt(address):
            return
        _remember(self.refused_until, address, self._clock() + REFUSED_KEEP_S)
        if address in self.waiting and not self._fresh(self.good_until, address):
            for waiter in self.waiting.pop(address):
                waiter.refused()

    def authenticated(self, address: str | None) -> None:
        """``address`` presented a valid key: not limited for GOOD_KEEP_S; its waiting connections
        are read now."""
        if not address or self.per_address <= 0:
            return
        until_s = self.good_until.get(address)
        now_s = self._clock()
        if until_s is not None and until_s - now_s > GOOD_KEEP_S / 2 and address not in self.waiting:
            return  # fresh enough: most requests stop here
        _remember(self.good_until, address, now_s + GOOD_KEEP_S)
        for waiter in self.waiting.pop(address, {}):
            self.read[address] = self.read.get(address, 0) + 1
            waiter.resume(address)

    def _fresh(self, until: dict[str, float], address: str) -> bool:
        until_s = until.get(address)
        if until_s is None:
            return False
        if until_s <= self._clock():
            del until[address]
            return False
        return True

    def limited(self, address: str) -> bool:
        """Whether ``address`` was refused a key lately (and presented no valid key lately)."""
        return self._fresh(self.refused_until, address) and not self._fresh(self.good_until, address)

    def admit(self, address: str | None) -> tuple[str | None, str]:
        """A new connection from ``address``: (the address it is counted under, None if not
        counted; READ, WAIT or HOLD). A connection counted must be given back with `closed`; one
        told to WAIT is registered with `wait`."""
        if not address or self.per_address <= 0 or self._exempt(address):
            return None, READ
        count = self.read.get(address, 0)
        if count >= self.per_address and not self._fresh(self.good_until, address):
            if self.limited(address):
                return None, HOLD
            if self.held < self.max_held:  # else read it: a client never refused is not turned away
                return None, WAIT
        self.read[address] = count + 1
        return address, READ

    def waited(self, address: str) -> tuple[str | None, str]:
        """A connection that waited its time: read it now (counted), or HOLD it if its address was
        refused meanwhile."""
        if self.limited(address):
            return None, HOLD
        self.read[address] = self.read.get(address, 0) + 1
        return address, READ

    def wait(self, address: str, waiter: Waiter) -> None:
        self.waiting.setdefault(address, {})[waiter] = None

    def unwait(self, address: str, waiter: Waiter) -> None:
        waiters = self.waiting.get(address)
        if waiters is None:
            return
        waiters.pop(waiter, None)
        if not waiters:
            del self.waiting[address]

    def may_parse(self, address: str) -> bool:
        """Whether a connection counted under ``address`` may have its first request parsed (its
        address refused since it was accepted, with more than ``per_address`` read: not)."""
        return self.read.get(address, 0) <= self.per_address or not self.limited(address)

    def closed(self, address: str) -> None:
        """A connection counted under ``address`` is gone: its place goes to the oldest one
        waiting, unless the address was refused lately."""
        count = self.read.pop(address) - 1
        if count > 0:
            self.read[address] = count
        waiters = self.waiting.get(address)
        if waiters and count < self.per_address and not self.limited(address):
            waiter = next(iter(waiters))
            self.unwait(address, waiter)
            self.read[address] = count + 1
            waiter.resume(address)

    def hold_for(self) -> float:
        """How long a connection told to HOLD is held (0: answer it at once, too many are paused)."""
        if self.held >= self.max_held:
            return 0.0
        return self.hold_s * (0.5 + self._jitter())

    def wait_for(self) -> float:
        """How long a connection told to WAIT waits at most before it is read anyway."""
        return self.wait_s * (0.5 + self._jitter())


def _remember(until: dict[str, float], address: str, until_s: float) -> None:
    until.pop(address, None)  # re-inserted last: the dict's order is its age
    if len(until) >= ADDRESSES_MAX:
        del until[next(iter(until))]
    until[address] = until_s


def key_accepted() -> None:
    """The request being served (`CLIENT`, set by the gateway's ASGI handler) presented a valid key."""
    address = CLIENT.get()
    if address is not None:
        connection_limit().authenticated(address)


_limit: ConnectionLimit | None = None


def connection_limit() -> ConnectionLimit:
    global _limit
    if _limit is None:
        _limit = ConnectionLimit(
            per_address=settings.FAIRGATE_CONNECTIONS_PER_ADDRESS,
            hold_s=settings.FAIRGATE_AUTH_TARPIT_MS / 1000,
            max_held=settings.FAIRGATE_AUTH_TARPIT_MAX,
        )
    return _limit
