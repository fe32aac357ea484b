"""Connections per client address, counted where `manage.py serve` accepts them: past
FAIRGATE_CONNECTIONS_PER_ADDRESS being read at once from one address, a new connection is not read
at all; it is held about FAIRGATE_AUTH_TARPIT_MS, answered 429 and closed. A peer in
FAIRGATE_TRUSTED_PROXIES is never limited here (its clients are the proxy's to limit).
Why and the figures: docs/money.md, "Refused before it costs anything"; bench/REPORT-adversarial.md."""

from __future__ import annotations

import random
from collections.abc import Callable

from django.conf import settings

from gateway.clientip import proxy_trusted

HELD_ANSWER = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
    b"connection: close\r\ncontent-length: 113\r\n\r\n"
    b'{"error": {"message": "Too many connections from your address.", "type": "rate_limit", '
    b'"code": "too_many_connections"}}'
)


class ConnectionLimit:
    """Counts the connections being read per address (``per_address`` at most, 0: no limit);
    a connection past that is held (``hold_s`` 0.5-1.5x), at most ``max_held`` at once."""

    def __init__(
        self,
        *,
        per_address: int,
        hold_s: float,
        max_held: int,
        exempt: Callable[[str], bool] = proxy_trusted,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.per_address = per_address
        self.hold_s = hold_s
        self.max_held = max_held
        self.read: dict[str, int] = {}
        self.held = 0
        self._exempt = exempt
        self._jitter = jitter

    def admit(self, address: str | None) -> tuple[str | None, bool]:
        """A new connection from ``address``: (the address it is counted under, None if not
        counted; whether it may be read). A connection admitted and counted must be given back
        with `closed`."""
        if not address or self.per_address <= 0 or self._exempt(address):
            return None, True
        count = self.read.get(address, 0)
        if count >= self.per_address:
            return None, False
        self.read[address] = count + 1
        return address, True

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
