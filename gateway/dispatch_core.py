"""What the embedded and the shared dispatcher both hold, around their engine: this process's live
entries and id claims, the terminal log, downgrade events, circuits, and the configuration (its
downgrade rules, backend specs and the poll that follows its changes).

Each dispatcher (gateway.dispatcher, gateway.shared) holds one `DispatchCore` and implements the
scheduler's port (gateway.port) on it; only their engine calls differ.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from audit.models import AuditLog
from gateway import charging
from gateway.db import db_call, log_failure
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.events import DowngradeLog
from gateway.lifecycle import State
from gateway.terminal import TerminalLog
from gateway.tokens import encoding
from scheduling.engine import Scheduler
from scheduling.engine.circuits import Circuits
from scheduling.engine.model import BackendSpec, Request, RequestId, SchedulerConfig
from scheduling.engine.rules import CompiledRules, compile_rules
from scheduling.selectors import config_live
from scheduling.upstreams import missing_env

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Entry:
    """One admitted request as the gateway follows it."""

    key: RequestId  # the engine's id: <tenant>/<public id>
    public_id: str
    tenant: str
    model: str
    cls: str
    declared_class: str
    downgrade_rule: str | None
    queued_since_ms: int
    future: asyncio.Future
    state: str = State.QUEUED  # State while live, then its outcome (gateway.lifecycle)
    waited_ms: int = 0
    backend: str | None = None
    preempt: bool = False
    boosted: bool = False
    requeues: int = 0
    failures: int = 0
    orphan: bool = False  # its client left, but the policy ignores cancellation (fifo preset)
    job: str | None = None  # the client's job (Request.job): the console groups its requests by it
    extra: dict = field(default_factory=dict)


def id_in_use(public_id: str) -> GatewayError:
    return invalid_request(f"X-Request-Id '{public_id}' is already in use by one of your live requests.")


def admission_refused(request: Request, reason: str | None, retry_after_ms: int | None) -> GatewayError:
    """The client's answer to an engine refusing ``request`` (``queue_full``, else no backend)."""
    if reason == "queue_full":
        return GatewayError(
            429,
            ErrorCode.QUEUE_FULL,
            f"The {request.cls} queue is full. Back off and retry after the Retry-After delay.",
            retry_after_ms=retry_after_ms or 1000,
        )
    return GatewayError(503, ErrorCode.NO_BACKEND, f"No enabled backend serves model '{request.model}' right now.")


def queue_timeout_error(entry: Entry) -> GatewayError:
    return GatewayError(
        504,
        ErrorCode.QUEUE_TIMEOUT,
        f"Request {entry.public_id} waited {entry.waited_ms} ms in class {entry.cls} without being served: "
        "the system is overloaded for this class. Do not retry now; degrade (smaller or lower-class request) "
        "or try again later.",
    )


def describe(entry: Entry, *, position, state: str | None = None) -> dict:
    """The queue API's view of one request (``position`` is the engine's QueuePosition or None;
    ``state``: the engine's, where it is ahead of the entry's)."""
    state = state or entry.state
    eta_ms = eta_upper_ms = None
    if position is not None and position.eta_ms >= 0:
        eta_ms, eta_upper_ms = position.eta_ms, position.eta_upper_ms
    elif state == State.RUNNING:
        eta_ms = eta_upper_ms = 0
    return {
        "id": entry.public_id,
        "class": entry.cls,
        "declared_class": entry.declared_class,
        "downgrade_rule": entry.downgrade_rule,
        "state": str(state),  # plain text (an enum member would make the record a tracked object)
        "position": position.position if position is not None else None,
        "position_exact": position.exact if position is not None else None,
        "eta_ms": eta_ms,
        "eta_upper_ms": eta_upper_ms,
        "eta_confidence": position.eta_confidence if position is not None else None,
        "eta_slip_reason": position.eta_slip_reason if position is not None else None,
        "eta_first_at_ms": None,  # set by live_view (wall clock)
        "waited_ms": entry.waited_ms,
        "model": entry.model,
        "backend": entry.backend,
        "job": entry.job,
    }


def live_view(engine: Scheduler, entry: Entry, now_ms: int, *, wall_offset_ms: int = 0) -> dict:
    """The queue API's and the console's view of one live request, with its wait so far. The
    engine's state decides (with the shared scheduler a grant reaches this process a moment
    after the engine made it: the request is shown running from then). ``wall_offset_ms``: epoch ms
    less the engine's clock (0 for the shared engine, whose clock is the wall clock)."""
    state = engine.state_of(entry.key) or entry.state
    position = engine.position(entry.key, now_ms=now_ms) if state == State.QUEUED else None
    row = describe(entry, position=position, state=state)
    if position is not None and position.eta_first_at_ms is not None:
        row["eta_first_at_ms"] = position.eta_first_at_ms + wall_offset_ms
    if entry.state == State.QUEUED:
        row["waited_ms"] = entry.waited_ms + max(0, now_ms - entry.queued_since_ms)
    return row


def _latest_audit_pk() -> int | None:
    return AuditLog.objects.order_by("-pk").values_list("pk", flat=True).first()


def _load() -> tuple[int | None, SchedulerConfig]:
    pk = _latest_audit_pk()
    return pk, config_live()


def _credentials_present(config: SchedulerConfig) -> bool:
    """A configuration whose backends name a variable this process lacks is refused (the one in
    force stays), with a log line naming the backend and the variable."""
    missing = missing_env(config.backends or ())
    for problem in missing:
        log.error("configuration refused: %s", problem)
    return not missing


async def startup() -> tuple[int | None, SchedulerConfig]:
    """Before a dispatcher starts: the live configuration (with its audit row), the holds a
    previous process left released, the tokenizer loaded (not on the first request)."""
    audit_pk, config = await db_call(_load)()
    await db_call(charging.release_leftover_holds)()
    await asyncio.to_thread(encoding)
    return audit_pk, config


def compiled_rules(config: SchedulerConfig, *, previous: CompiledRules | None) -> CompiledRules:
    """The configuration's downgrade rules; ``previous`` when they do not compile (the first
    configuration, with none before it, raises)."""
    try:
        return compile_rules(config.downgrade_rules, config.networks, config.classes)
    except ValueError:
        log.exception("downgrade rules do not compile; keeping the previous rules")
        if previous is None:
            raise
        return previous


class DispatchCore:
    """One dispatcher's state around its engine (see the module's docstring)."""

    def __init__(self, config: SchedulerConfig, *, audit_pk: int | None, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.circuits = Circuits(
            threshold=settings.FAIRGATE_CIRCUIT_FAILURES, cooldown_ms=settings.FAIRGATE_CIRCUIT_COOLDOWN_MS
        )
        self.also_open: Callable[[str, int], bool] | None = None  # another view of the circuits (shared)
        self.downgrades = DowngradeLog()
        self.terminal = TerminalLog(
            keep_ms=settings.FAIRGATE_TERMINAL_KEEP_MS, max_entries=settings.FAIRGATE_TERMINAL_MAX
        )
        self.live: dict[str, dict[str, Entry]] = {}  # tenant -> public id -> entry
        self.claimed: set[RequestId] = set()  # ids between intake's check and their admission or refusal
        self.config = config
        self.rules = compiled_rules(config, previous=None)
        self.backend_specs = self._backend_specs_of(config)
        self.audit_pk = audit_pk
        self.poller: asyncio.Task | None = None

    async def close(self) -> None:
        """Stops the configuration poll and fails what still waits for a grant."""
        if self.poller is not None:
            self.poller.cancel()
            await asyncio.gather(self.poller, return_exceptions=True)
        for entries in self.live.values():
            for entry in entries.values():
                if not entry.future.done():
                    entry.future.set_exception(
                        GatewayError(503, ErrorCode.NO_BACKEND, "The gateway is shutting down; retry.")
                    )
        await self.downgrades.flush()

    # --- configuration -------------------------------------------------------------------

    def take(self, config: SchedulerConfig) -> None:
        """``config`` is in force here (its rules and backends; the engine is the dispatcher's)."""
        rules = compiled_rules(config, previous=self.rules)
        self.config = config
        self.rules = rules
        self.backend_specs = self._backend_specs_of(config)

    @staticmethod
    def _backend_specs_of(config: SchedulerConfig) -> dict[str, BackendSpec]:
        return {b.name: b for b in config.backends or ()}

    def effective_backends(self, now_ms: int) -> tuple[BackendSpec, ...]:
        return self.circuits.effective(self.backend_specs.values(), now_ms)

    def poll_start(
        self, apply_config: Callable[[SchedulerConfig], None], pump: Callable[[], None], tick: Callable[[], None]
    ) -> None:
        """Follows the configuration; ``pump`` and ``tick`` (periodic work: the demand store's) after each poll."""
        self.poller = asyncio.create_task(self._poll(apply_config, pump, tick), name="fairgate-config-poll")

    async def _poll(
        self, apply_config: Callable[[SchedulerConfig], None], pump: Callable[[], None], tick: Callable[[], None]
    ) -> None:
        interval_s = settings.FAIRGATE_CONFIG_POLL_MS / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                pk = await db_call(_latest_audit_pk)()
                if pk != self.audit_pk:
                    pk, config = await db_call(_load)()
                    self.audit_pk = pk
                    if config != self.config and _credentials_present(config):  # else: the queues stay as they are
                        apply_config(config)
                await self.downgrades.flush()
            except Exception:  # a failed poll must not stop the dispatcher
                log_failure(log, "configuration poll failed")
            pump()
            tick()

    # --- backends ------------------------------------------------------------------------

    def circuit_open(self, backend: str, now_ms: int) -> bool:
        """This process's circuit is open, or (shared scheduler) the dispatcher's."""
        if self.circuits.is_open(backend, now_ms):
            return True
        return self.also_open is not None and self.also_open(backend, now_ms)

    def serves_now(self, model: str, now_ms: int) -> bool:
        """An enabled backend with a closed circuit serves ``model``."""
        return any(
            model in b.models and b.enabled and not self.circuit_open(b.name, now_ms)
            for b in self.backend_specs.values()
        )

    def check_model(self, model: str, *, embeddings: bool, now_ms: int) -> None:
        """400 unless a backend serves ``model`` for the request's endpoint (a backend's
        ``embedding_models`` are served at /v1/embeddings only, its other models everywhere else);
        503 if none of them can take it now."""
        specs = [b for b in self.backend_specs.values() if model in b.models]
        if not specs:
            served = sorted({m for b in self.backend_specs.values() if b.enabled for m in b.models})
            raise invalid_request(f"Unknown model '{model}'. Models served here: {', '.join(served) or 'none'}.")
        embeds = any(model in b.embedding_models for b in specs)
        if embeddings and not embeds:
            listed = sorted({m for b in self.backend_specs.values() if b.enabled for m in b.embedding_models})
            raise invalid_request(
                f"Model '{model}' does not make embeddings here. Embedding models: {', '.join(listed) or 'none'}."
            )
        if not embeddings and embeds:
            raise invalid_request(f"Model '{model}' makes embeddings: send it to POST /v1/embeddings.")
        if not self.serves_now(model, now_ms):
            raise GatewayError(
                503,
                ErrorCode.NO_BACKEND,
                f"No enabled backend serves model '{model}' right now; try again later or use another model.",
            )

    def upstream_result(self, backend: str, *, ok: bool, now_ms: int) -> bool:
        """Feeds the circuit breaker; True when the backend's circuit opened."""
        if ok:
            self.circuits.success(backend)
            return False
        if self.circuits.failure(backend, now_ms):
            log.warning("circuit open for backend %s for %d ms", backend, self.circuits.cooldown_ms)
            return True
        return False

    def credential_refused(self, backend: str, detail: str, now_ms: int) -> bool:
        """The backend refused the gateway's credential: its circuit opens at once (not after
        ``threshold`` failures), and the log says why (never the key). True when it opened."""
        log.error(
            "backend %s: upstream credential refused (%s); circuit open for %d ms; check its api_key_env",
            backend,
            detail,
            self.circuits.cooldown_ms,
        )
        return self.circuits.trip(backend, now_ms)

    # --- live entries --------------------------------------------------------------------

    def is_live(self, tenant: str, public_id: str) -> bool:
        return public_id in self.live.get(tenant, {})

    def claim(self, key: RequestId, *, tenant: str, public_id: str) -> None:
        """Reserves a request's id from intake to its admission (then its live entry keeps it):
        a second request of the id is refused before it holds anything. Raises 400 if taken."""
        if key in self.claimed or self.is_live(tenant, public_id):
            raise id_in_use(public_id)
        self.claimed.add(key)

    def unclaim(self, key: RequestId) -> None:
        self.claimed.discard(key)

    def entry_new(self, request: Request, public_id: str, declared_class: str, rule: str | None, now_ms: int) -> Entry:
        """The live entry of an admitted ``request``."""
        entry = Entry(
            request.id,
            public_id,
            request.tenant,
            request.model,
            request.cls,
            declared_class,
            rule,
            now_ms,
            self.loop.create_future(),
            job=request.job,
        )
        self.live.setdefault(request.tenant, {})[public_id] = entry
        return entry

    def entry_drop(self, entry: Entry) -> None:
        """``entry`` is no longer live (its public id may be used again)."""
        entries = self.live.get(entry.tenant)
        if entries is not None and entries.get(entry.public_id) is entry:
            del entries[entry.public_id]
            if not entries:
                del self.live[entry.tenant]

    def entry(self, key: str) -> Entry | None:
        tenant, _, public_id = key.partition("/")
        return self.live.get(tenant, {}).get(public_id)

    def entry_of(self, tenant: str, public_id: str) -> Entry | None:
        return self.live.get(tenant, {}).get(public_id)

    def entries_of(self, tenant: str) -> list[Entry]:
        return list(self.live.get(tenant, {}).values())

    def requeued(self, entry: Entry, now_ms: int) -> None:
        """``entry`` waits again for a grant (a new future for its next wait)."""
        self.leave_backend(entry)
        entry.state = State.QUEUED
        entry.queued_since_ms = now_ms
        entry.future = self.loop.create_future()

    def orphaned(self, entry: Entry) -> None:
        """A cancel the policy ignores: ``entry`` stays queued, served for nobody."""
        entry.orphan = True
        if entry.future.done():  # cancelled with the client's task: a new one for whoever serves it
            entry.future = self.loop.create_future()

    def granted(self, entry: Entry, backend: str, *, preempt: bool, boosted: bool) -> None:
        entry.state = State.RUNNING
        entry.backend = backend
        entry.preempt = preempt
        entry.boosted = boosted
        self.circuits.of(backend).in_use += 1

    def leave_backend(self, entry: Entry) -> None:
        if entry.state == State.RUNNING and entry.backend:
            self.circuits.of(entry.backend).in_use -= 1

    def finish(self, entry: Entry, outcome: str, now_ms: int) -> dict:
        """``entry`` ends with ``outcome``: no longer live, its record in the terminal log (for
        GET /v1/queue/{id} and the console); returns the record."""
        if entry.state == State.QUEUED:
            entry.waited_ms += max(0, now_ms - entry.queued_since_ms)
        entry.state = outcome
        self.entry_drop(entry)
        record = describe(entry, position=None)
        record["finished_at"] = timezone.now().isoformat()
        self.terminal.add(entry.tenant, entry.public_id, record, now_ms=now_ms)
        return record


class OnCore:
    """The part of the scheduler's port both dispatchers answer from their DispatchCore alone."""

    core: DispatchCore

    def _hold_core(self, config: SchedulerConfig, *, audit_pk: int | None, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core = DispatchCore(config, audit_pk=audit_pk, loop=loop)
        self.loop = loop
        self.circuits = core.circuits
        self.downgrades = core.downgrades
        self.terminal = core.terminal
        self.live = core.live

    def now_ms(self) -> int:
        raise NotImplementedError

    @property
    def config(self) -> SchedulerConfig:
        return self.core.config

    @property
    def rules(self) -> CompiledRules:
        return self.core.rules

    @property
    def backend_specs(self) -> dict[str, BackendSpec]:
        return self.core.backend_specs

    def _effective_backends(self) -> tuple[BackendSpec, ...]:
        return self.core.effective_backends(self.now_ms())
