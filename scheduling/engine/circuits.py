"""Per-backend circuit breakers (and a gateway's own view of backend use).

A backend's circuit opens after ``threshold`` consecutive upstream failures and stays open for
``cooldown_ms``; the dispatcher then takes the backend out of the engine's rotation (disabled in
its specs: `effective`) and puts it back when the cool-down ends (half-open: one more failure
re-opens it at once, a success closes it). Plain Python and the caller's clock, like the engine:
the embedded dispatcher keeps one (gateway.dispatcher), and the shared one keeps one for all the
gateways it serves, fed by their reports (scheduling.shared.protocol).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from scheduling.engine.admission import RateWindow
from scheduling.engine.model import BackendSpec


@dataclass
class BackendHealth:
    failures: int = 0
    open_until_ms: int = 0
    half_open: bool = False
    in_use: int = 0
    # Tokens of the requests completed over the rate window, in RateWindow entries: bounded
    # whatever the rate, and whether or not anyone reads it (one entry per completion, dropped only
    # when read, grew without end in a gateway whose /metrics nobody scraped).
    tokens: RateWindow = field(default_factory=RateWindow)

    def tpm_used(self, now_ms: int) -> int:
        return self.tokens.count(now_ms)


@dataclass
class Circuits:
    threshold: int
    cooldown_ms: int
    health: dict[str, BackendHealth] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        """Plain data (the shared dispatcher's snapshot)."""
        health = {
            name: [h.failures, h.open_until_ms, h.half_open, h.in_use, h.tokens.as_record()]
            for name, h in self.health.items()
        }
        return {"threshold": self.threshold, "cooldown_ms": self.cooldown_ms, "health": health}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Circuits:
        circuits = cls(threshold=record["threshold"], cooldown_ms=record["cooldown_ms"])
        for name, (failures, open_until_ms, half_open, in_use, tokens) in record["health"].items():
            circuits.health[name] = BackendHealth(
                failures, open_until_ms, half_open, in_use, RateWindow.from_record(tokens)
            )
        return circuits

    def of(self, name: str) -> BackendHealth:
        health = self.health.get(name)
        if health is None:
            health = self.health[name] = BackendHealth()
        return health

    def success(self, name: str) -> bool:
        """Record a success; True if this closed a half-open circuit."""
        health = self.of(name)
        closed = health.half_open
        health.failures = 0
        health.half_open = False
        return closed

    def failure(self, name: str, now_ms: int) -> bool:
        """Record a failure; True if this opened the circuit."""
        health = self.of(name)
        health.failures += 1
        if health.open_until_ms > now_ms:
            return False
        if health.half_open or health.failures >= self.threshold:
            health.open_until_ms = now_ms + self.cooldown_ms
            health.half_open = False
            return True
        return False

    def trip(self, name: str, now_ms: int) -> bool:
        """Open the circuit at once (the backend refused the gateway's credential); True if it was closed."""
        health = self.of(name)
        health.failures += 1
        if health.open_until_ms > now_ms:
            return False
        health.open_until_ms = now_ms + self.cooldown_ms
        health.half_open = False
        return True

    def reopen_due(self, now_ms: int) -> list[str]:
        """Backends whose cool-down has ended: now half-open."""
        due = [n for n, h in self.health.items() if h.open_until_ms and h.open_until_ms <= now_ms]
        for name in due:
            health = self.health[name]
            health.open_until_ms = 0
            health.half_open = True
            health.failures = 0
        return due

    def is_open(self, name: str, now_ms: int) -> bool:
        health = self.health.get(name)
        return health is not None and health.open_until_ms > now_ms

    def effective(self, backends: Iterable[BackendSpec], now_ms: int) -> tuple[BackendSpec, ...]:
        """``backends`` as the engine should see them: those whose circuit is open disabled."""
        return tuple(replace(b, enabled=False) if b.enabled and self.is_open(b.name, now_ms) else b for b in backends)

    def next_change_ms(self) -> int | None:
        times = [h.open_until_ms for h in self.health.values() if h.open_until_ms]
        return min(times) if times else None

    def add_tokens(self, name: str, now_ms: int, tokens: int) -> None:
        self.of(name).tokens.add(now_ms, tokens)
