"""What the scheduler answers: admissions, grants and queue positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .model import Request


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    reason: str | None = None  # "queue_full" | "no_backend"
    retry_after_ms: int | None = None


ADMITTED = Admission(True)
NO_BACKEND = Admission(False, "no_backend")


class Grant(NamedTuple):
    """One dispatch decision. Immutable; a named tuple because one is made per grant on the hot
    path, and a frozen dataclass costs about twice as much to build."""

    request: Request
    backend: str
    waited_ms: int
    preempt: bool  # dispatched in the preempt stage (wait ratio at or past the preempt bound)
    boosted: bool  # its class won over a waiting lower-level class thanks to aging


class Live(NamedTuple):
    """One live request as the engine has it (``Scheduler.requests_of``)."""

    request: Request
    state: str  # "queued" | "running"
    backend: str | None  # running: the backend granted
    dispatched_ms: int | None  # running: when


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A waiting request's place and ETA (``eta``: docs/engine.md, "Position and ETA")."""

    position: int  # 1 = next for its model
    eta_ms: int  # -1 when no backend serves its model at all
    exact: bool
    eta_upper_ms: int = -1  # the bound it should start by: eta_ms <= eta_upper_ms <= 2 * eta_ms
    eta_confidence: str = "prior"  # "measured" | "prior" (no completion of its class yet) | "blocked"
    eta_slip_reason: str | None = None  # once its expected start is past the first one given
    eta_first_at_ms: int | None = None  # the expected start (engine ms) the first query gave
