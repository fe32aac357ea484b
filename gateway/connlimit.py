"""Connections per client address, counted where `manage.py serve` accepts them. An address refused
a key (401) in the last REFUSED_KEEP_S has at most FAIRGATE_CONNECTIONS_PER_ADDRESS connections read
at once: one more is not read at all (at its accept, or before its first request is parsed): held
about FAIRGATE_AUTH_TARPIT_MS, answered 429 and closed. A peer in FAIRGATE_TRUSTED_PROXIES is never
limited here (its clients are the proxy's to limit). Why and the figures: docs/money.md, "Refused
before it costs anything"; bench/REPORT-adversarial.md."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from django.conf import settings

from gateway.clientip import proxy_trusted

HELD_ANSWER = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
    b"connection: close\r\ncontent-length: 113\r\n\r\n"
    b'{"error": {"message": "Too many connections from your address.", "type": "rate_limit", '
    b'"code": "too_many_connections"}}'
)
REFUSED_KEEP_S = 30.0  # how long a 401 keeps its address limited
REFUSED_MAX = 100_000  # addresses remembered, the oldest forgotten first


class ConnectionLimit:
    """Counts the connections being read per address; an address `refused` lately has
    ``per_address`` at most (0: no limit); a connection past that is held (``hold_s`` 0.5-1.5x),
    at most ``max_held`` at once."""

    def __init__(
        self,
        *,
        per_address: int,
        hold_s: float,
        max_held: int,
        exempt: Callable[[str], bool] = proxy_trusted,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.per_address = per_address
        self.hold_s = hold_s
        self.max_held = max_held
        self.read: dict[str, int] = {}
        self.refused_until: dict[str, float] = {}  # address → until when it is limited, oldest first
        self.held = 0
        self._exempt = exempt
        self._clock = clock
        self._jitter = jitter

    def refused(self, address: str | None) -> None:
        """``address`` was refused a key: limited for REFUSED_KEEP_S from now."""
        if not address or self.per_address <= 0 or self._exempt(address):
            return
        self.refused_until.pop(address, None)  # re-inserted last: the dict's order is its age
        if len(self.refused_until) >= REFUSED_MAX:
            del self.refused_until[next(iter(self.refused_until))]
        self.refused_until[address] = self._clock() + REFUSED_KEEP_S

    def _limited(self, address: str) -> bool:
        until_s = self.refused_until.get(address)
        if until_s is None:
            return False
        if until_s <= self._clock():
            del self.refused_until[address]
            return False
        return True

    def admit(self, address: str | None) -> tuple[str | None, bool]:
        """A new connection from ``address``: (the address it is counted under, None if not
        counted; whether it may be read). A connection counted must be given back with `closed`."""
        if not address or self.per_address <= 0 or self._exempt(address):
            return None, True
        count = self.read.get(address, 0)
        if count >= self.per_address and self._limited(address):
            return None, False
        self.read[address] = count + 1
        return address, True

    def may_parse(self, address: str) -> bool:
        """Whether a connection counted under ``address`` may have its first request parsed (its
        address refused since it was accepted, with more than ``per_address`` read: not)."""
        return self.read.get(address, 0) <= self.per_address or not self._limited(address)

    def closed(self, address: str) -> None:
        count = self.read.pop(address) - 1
        if count > 0:
            self.read[address] = count

    def hold_for(self) -> float:
        """How long a connection refused by `admit` is held (0: close it at once, too many are)."""
        if self.held >= self.max_held:
            return 0.0
        return self.hold_s * (0.5 + self._jitter())


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
