"""What a simulation run measures, and the shape of its JSON output.

All times are virtual milliseconds, except ``decision_us`` (the engine's wall-clock cost per
decision). Each measure's definition (waits, SLA, abandoned, goodput, the Jain index):
docs/simulator.md, "What a run measures".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def wait_summary(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1] if ordered else 0,
    }


def mean(values: list[int]) -> float:
    return round(sum(values) / len(values), 1) if values else 0.0


@dataclass(slots=True)
class ClassStats:
    arrived: int = 0
    admitted: int = 0
    downgraded_in: int = 0
    completed: int = 0
    completed_within_sla: int = 0
    rejected_queue_full: int = 0
    rejected_no_backend: int = 0
    queue_timeout: int = 0
    abandoned: int = 0
    served_after_give_up: int = 0
    waits: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.__slots__ if name != "waits"}
        out["wait_ms"] = wait_summary(self.waits)
        return out


@dataclass(slots=True)
class TenantStats:
    arrived: int = 0
    completed: int = 0
    rejected: int = 0
    queue_timeout: int = 0
    abandoned: int = 0
    tokens_served: int = 0
    waits: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        ordered = sorted(self.waits)
        return {
            "arrived": self.arrived,
            "completed": self.completed,
            "rejected": self.rejected,
            "queue_timeout": self.queue_timeout,
            "abandoned": self.abandoned,
            "wait_ms": {"mean": mean(self.waits), "p95": percentile(ordered, 95)},
            "tokens_served": self.tokens_served,
        }


class JainTracker:
    """Backlog-window Jain index (see the module docstring)."""

    def __init__(self, weights: dict[str, float], window_ms: int) -> None:
        self.weights = weights
        self.window_ms = window_ms
        self.next_end_ms = window_ms
        self.waiting: dict[tuple[str, str], int] = {}
        self.backlogged: set[tuple[str, str]] = set()
        self.service: dict[tuple[str, str], int] = {}
        self.samples: list[float] = []

    def add_waiting(self, key: tuple[str, str]) -> None:
        self.waiting[key] = self.waiting.get(key, 0) + 1

    def remove_waiting(self, key: tuple[str, str]) -> None:
        left = self.waiting[key] - 1
        self.waiting[key] = left
        if left == 0:
            self.backlogged.discard(key)

    def served(self, key: tuple[str, str], tokens: int) -> None:
        self.service[key] = self.service.get(key, 0) + tokens

    def roll_until(self, t_ms: int) -> None:
        """Close every window that ends at or before ``t_ms``."""
        while self.next_end_ms <= t_ms:
            self._close()
            self.next_end_ms += self.window_ms

    def _close(self) -> None:
        by_class: dict[str, list[float]] = {}
        for cls, tenant in sorted(self.backlogged):
            x = self.service.get((cls, tenant), 0) / self.weights.get(tenant, 1.0)
            by_class.setdefault(cls, []).append(x)
        for xs in by_class.values():
            squares = sum(x * x for x in xs)
            if len(xs) >= 2 and squares > 0:
                self.samples.append(sum(xs) ** 2 / (len(xs) * squares))
        self.backlogged = {k for k, n in self.waiting.items() if n > 0}
        self.service = {}

    def index(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 4) if self.samples else None


class Timeline:
    """Rows at every ``step_ms``: the state after all events at times <= ``t_ms``."""

    def __init__(self, step_ms: int) -> None:
        self.step_ms = step_ms
        self.next_t_ms = 0
        self.rows: list[dict] = []
        self.step_interactive_waits: list[int] = []

    def due(self, t_ms: int) -> bool:
        return self.next_t_ms < t_ms

    def emit(self, state: dict) -> None:
        ordered = sorted(self.step_interactive_waits)
        self.rows.append({"t_ms": self.next_t_ms, "interactive_p95_ms": percentile(ordered, 95), **state})
        self.step_interactive_waits = []
        self.next_t_ms += self.step_ms
