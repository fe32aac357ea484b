"""The scheduler's port: what the gateway's request path, the console and the Batch API ask of a
dispatcher (admit, wait for a grant, requeue, end, and a queue view), whichever runs this
process's engine: the embedded one (gateway.dispatcher) or the shared one (gateway.shared).

`QueueView` is the read side: per class, per backend and the ended requests, read on the
dispatcher's event loop. The console and the Batch API read it, never the engine.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.dispatch_core import DispatchCore, Entry
    from gateway.events import DowngradeLog
    from gateway.terminal import TerminalLog
    from scheduling.engine import Grant, QueuePosition, Scheduler
    from scheduling.engine.circuits import BackendHealth
    from scheduling.engine.counters import Tally
    from scheduling.engine.model import BackendSpec, ClassSpec, Request, RequestId, SchedulerConfig
    from scheduling.engine.rules import CompiledRules


class QueueView:
    """The queues as this process sees them: the engine's figures (with the shared scheduler, its
    replica's: every process's requests), this process's backends, circuits and ended requests."""

    def __init__(self, engine: Scheduler, core: DispatchCore) -> None:
        self._engine = engine
        self._core = core

    # --- classes -------------------------------------------------------------------------

    def classes(self) -> tuple[ClassSpec, ...]:
        return tuple(self._core.config.classes)

    def class_levels(self) -> dict[str, int]:
        """Each class's level as the gateway classifies requests (lower is more urgent)."""
        return self._core.rules.levels

    def class_tallies(self) -> dict[str, Tally]:
        """Each class's counters (admitted, completed, boosted, ..., its wait histogram)."""
        return self._engine.counters.classes

    def depth(self, cls: str) -> int:
        return self._engine.depth(cls)

    def depth_limit(self, cls: str, *, now_ms: int) -> int:
        return self._engine.depth_limit(cls, now_ms=now_ms)

    def service_ms(self, cls: str) -> float:
        """The class's mean service time as the engine plans with it."""
        return self._engine.service_ms(cls)

    @property
    def waiting_count(self) -> int:
        return self._engine.waiting_count

    # --- backends ------------------------------------------------------------------------

    def backends(self) -> dict[str, BackendSpec]:
        return self._core.backend_specs

    def backend_health(self, name: str) -> BackendHealth:
        """This process's view of ``name``: its requests running there, its tokens per minute."""
        return self._core.circuits.of(name)

    def circuit_open_here(self, name: str, now_ms: int) -> bool:
        """This process's circuit of ``name`` (not the shared dispatcher's)."""
        return self._core.circuits.is_open(name, now_ms)

    def running_by_backend(self) -> Counter[str | None]:
        """Requests running on each backend (with the shared scheduler: every process's)."""
        engine = self._engine
        return Counter(engine.backend_of(request.id) for request in engine.running())

    # --- requests ------------------------------------------------------------------------

    def position(self, key: RequestId, *, now_ms: int) -> QueuePosition | None:
        """A waiting request's position and ETA (point, upper bound, confidence, slip reason, the
        first expected start given, in the engine's clock); None when it is not waiting."""
        return self._engine.position(key, now_ms=now_ms)

    def tenants_live(self) -> set[str]:
        """Tenants with a live request in this process."""
        return set(self._core.live)

    def ended(self, tenant: str, public_id: str, *, now_ms: int) -> dict | None:
        """A finished request's record (the terminal log keeps an hour of them)."""
        return self._core.terminal.get(tenant, public_id, now_ms=now_ms)

    def ended_jobs(self, tenant: str, *, now_ms: int) -> dict[str, list[dict]]:
        """``tenant``'s finished requests by job."""
        return self._core.terminal.jobs_of(tenant, now_ms=now_ms)


class SchedulerPort(Protocol):
    """A dispatcher as the rest of the gateway, the console and the Batch API use it."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def config(self) -> SchedulerConfig: ...
    @property
    def rules(self) -> CompiledRules: ...
    @property
    def backend_specs(self) -> dict[str, BackendSpec]: ...
    @property
    def terminal(self) -> TerminalLog: ...
    @property
    def downgrades(self) -> DowngradeLog: ...

    def now_ms(self) -> int: ...
    async def close(self) -> None: ...

    # admission
    def check_model(self, model: str, *, embeddings: bool = False) -> None: ...
    def serves_now(self, model: str) -> bool: ...
    def circuit_open(self, backend: str, now_ms: int) -> bool: ...
    def claim(self, key: RequestId, *, tenant: str, public_id: str) -> None: ...
    def unclaim(self, key: RequestId) -> None: ...
    async def admit(self, request: Request, *, public_id: str, declared_class: str, rule: str | None) -> Entry: ...
    async def wait_for_grant(self, entry: Entry) -> Grant: ...

    # outcomes
    def requeue(self, entry: Entry, *, retry_after_ms: int) -> None: ...
    def end(
        self, entry: Entry, outcome: str, *, prompt_tokens: int = 0, output_tokens: int = 0, served: bool = False
    ) -> bool: ...
    def upstream_result(self, backend: str, *, ok: bool) -> None: ...
    def credential_refused(self, backend: str, detail: str) -> None: ...

    # reads
    def queue_view(self) -> QueueView: ...
    def entries_of(self, tenant: str) -> list[Entry]: ...
    def entry_of(self, tenant: str, public_id: str) -> Entry | None: ...
    def live_view(self, entry: Entry, now_ms: int) -> dict: ...
    async def fresh(self) -> None: ...
