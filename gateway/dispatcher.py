"""The embedded dispatcher: one per process, owner of the engine's Scheduler.

Everything here runs on the event loop thread and never awaits while it touches the engine,
so the (synchronous) engine needs no lock. A *pump* — expire, dispatch, resolve the waiters'
futures, re-arm one timer for ``next_wakeup_ms`` — runs after every submit, completion,
cancel and requeue, and when the timer fires. A background task polls the configuration
(latest audit row) and hands changes to ``Scheduler.reconfigure``, and writes downgrade events.

Engine request ids are ``<tenant>/<public id>``: a client's own ``X-Request-Id`` is unique per
tenant, not globally.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from audit.models import AuditLog
from gateway import charging
from gateway.db import db_call, log_failure
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.events import DowngradeLog
from gateway.lifecycle import Outcome, State
from gateway.terminal import TerminalLog
from gateway.tokens import encoding
from scheduling.engine import Grant, Scheduler
from scheduling.engine.circuits import Circuits
from scheduling.engine.model import BackendSpec, Request, RequestId, SchedulerConfig
from scheduling.engine.presets import apply_policy
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


class Dispatcher:
    def __init__(self, config: SchedulerConfig, *, audit_pk: int | None, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.circuits = Circuits(
            threshold=settings.FAIRGATE_CIRCUIT_FAILURES, cooldown_ms=settings.FAIRGATE_CIRCUIT_COOLDOWN_MS
        )
        self.downgrades = DowngradeLog()
        self.terminal = TerminalLog(
            keep_ms=settings.FAIRGATE_TERMINAL_KEEP_MS, max_entries=settings.FAIRGATE_TERMINAL_MAX
        )
        self.live: dict[str, dict[str, Entry]] = {}  # tenant -> public id -> entry
        self.claimed: set[RequestId] = set()  # ids between intake's check and their admission or refusal
        self.config = config
        self.rules = self._compiled_rules(config, previous=None)
        self.backend_specs = self._backend_specs_of(config)
        self._audit_pk = audit_pk
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_ms: int | None = None
        self._poller: asyncio.Task | None = None
        self.sched = Scheduler(
            apply_policy(config, config.policy), tenants=config.tenants or (), backends=self._effective_backends()
        )

    # --- life cycle ----------------------------------------------------------------------

    @classmethod
    async def create(cls) -> Dispatcher:
        audit_pk, config = await db_call(_load)()
        await db_call(charging.release_leftover_holds)()
        await asyncio.to_thread(encoding)  # load the tokenizer now, not on the first request
        dispatcher = cls(config, audit_pk=audit_pk, loop=asyncio.get_running_loop())
        dispatcher._poller = asyncio.create_task(dispatcher._poll(), name="fairgate-config-poll")
        return dispatcher

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
        for entries in self.live.values():
            for entry in entries.values():
                if not entry.future.done():
                    entry.future.set_exception(
                        GatewayError(503, ErrorCode.NO_BACKEND, "The gateway is shutting down; retry.")
                    )
        await self.downgrades.flush()

    def now_ms(self) -> int:
        return int(self.loop.time() * 1000)

    # --- configuration -------------------------------------------------------------------

    def apply_config(self, config: SchedulerConfig) -> None:
        rules = self._compiled_rules(config, previous=self.rules)
        self.config = config
        self.rules = rules
        self.backend_specs = self._backend_specs_of(config)
        self._reconfigure_engine(
            config=apply_policy(config, config.policy),
            tenants=config.tenants or (),
            backends=self._effective_backends(),
        )

    def _reconfigure_engine(self, **changes) -> None:
        """The engine takes a new configuration, tenants or backends (gateway.shared: its own copy only)."""
        self.sched.reconfigure(now_ms=self.now_ms(), **changes)
        self.pump()

    @staticmethod
    def _compiled_rules(config: SchedulerConfig, *, previous: CompiledRules | None) -> CompiledRules:
        """The configuration's downgrade rules; ``previous`` when they do not compile (the first
        configuration, with none before it, raises)."""
        try:
            return compile_rules(config.downgrade_rules, config.networks, config.classes)
        except ValueError:
            log.exception("downgrade rules do not compile; keeping the previous rules")
            if previous is None:
                raise
            return previous

    @staticmethod
    def _backend_specs_of(config: SchedulerConfig) -> dict[str, BackendSpec]:
        return {b.name: b for b in config.backends or ()}

    def _effective_backends(self) -> tuple[BackendSpec, ...]:
        return self.circuits.effective(self.backend_specs.values(), self.now_ms())

    def _backends_changed(self) -> None:
        self._reconfigure_engine(backends=self._effective_backends())

    async def _poll(self) -> None:
        interval_s = settings.FAIRGATE_CONFIG_POLL_MS / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                pk = await db_call(_latest_audit_pk)()
                if pk != self._audit_pk:
                    pk, config = await db_call(_load)()
                    self._audit_pk = pk
                    if config != self.config and _credentials_present(config):  # else: the queues stay as they are
                        self.apply_config(config)
                await self.downgrades.flush()
            except Exception:  # a failed poll must not stop the dispatcher
                log_failure(log, "configuration poll failed")
            self.pump()

    # --- admission -----------------------------------------------------------------------

    def check_model(self, model: str, *, embeddings: bool = False) -> None:
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
        if not self.serves_now(model):
            raise GatewayError(
                503,
                ErrorCode.NO_BACKEND,
                f"No enabled backend serves model '{model}' right now; try again later or use another model.",
            )

    def serves_now(self, model: str) -> bool:
        """An enabled backend with a closed circuit serves ``model``."""
        now_ms = self.now_ms()
        return any(
            model in b.models and b.enabled and not self.circuit_open(b.name, now_ms)
            for b in self.backend_specs.values()
        )

    def circuit_open(self, backend: str, now_ms: int) -> bool:
        return self.circuits.is_open(backend, now_ms)

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

    async def admit(self, request: Request, *, public_id: str, declared_class: str, rule: str | None) -> Entry:
        """Submit to the engine (gateway.shared: to the shared one, which answers asynchronously)."""
        return self.admit_now(request, public_id=public_id, declared_class=declared_class, rule=rule)

    def admit_now(self, request: Request, *, public_id: str, declared_class: str, rule: str | None) -> Entry:
        """Submit to the engine; the entry's future resolves with a Grant or a GatewayError."""
        if self.is_live(request.tenant, public_id) or self.sched.state_of(request.id) is not None:
            raise id_in_use(public_id)
        admission = self.sched.submit(request, now_ms=request.enqueued_ms)
        if not admission.admitted:
            raise admission_refused(request, admission.reason, admission.retry_after_ms)
        entry = self._entry_new(request, public_id, declared_class, rule, request.enqueued_ms)
        self.pump()
        return entry

    def _entry_new(self, request: Request, public_id: str, declared_class: str, rule: str | None, now_ms: int) -> Entry:
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

    def _entry_drop(self, entry: Entry) -> None:
        """``entry`` is no longer live (its public id may be used again)."""
        entries = self.live.get(entry.tenant)
        if entries is not None and entries.get(entry.public_id) is entry:
            del entries[entry.public_id]
            if not entries:
                del self.live[entry.tenant]

    async def wait_for_grant(self, entry: Entry) -> Grant:
        """The next grant of ``entry`` (a slot on a backend); raises its refusal (queue timeout, the
        backend gone). Ask again after a requeue: each wait is for the grant in force then (the
        dispatcher keeps one future per wait on the entry; its readers never hold one)."""
        return await entry.future

    # --- outcomes ------------------------------------------------------------------------

    def requeue(self, entry: Entry, *, retry_after_ms: int) -> None:
        """Upstream 429 (or a retried failure): back to the front of its queue, not charged."""
        now_ms = self.now_ms()
        self._leave_backend(entry)
        entry.state = State.QUEUED
        entry.queued_since_ms = now_ms
        entry.future = self.loop.create_future()
        self.sched.requeue(entry.key, now_ms=now_ms, backend_retry_after_ms=max(0, retry_after_ms))
        self.pump()

    def end(
        self, entry: Entry, outcome: str, *, prompt_tokens: int = 0, output_tokens: int = 0, served: bool = False
    ) -> bool:
        """Final state of a request (idempotent): completed, cancelled, upstream_error, ...

        ``served``: the backend did the work (also a stream cut short): the engine completes it
        with the tokens used, so fair shares and TPM windows see them; otherwise it fails.
        False when the request goes on: a cancel that the policy ignores (``fifo`` preset, the
        old gateway) leaves it queued, to be served for nobody (``orphan``)."""
        if entry.state not in (State.QUEUED, State.RUNNING):
            return True
        now_ms = self.now_ms()
        engine_state = self.sched.state_of(entry.key)
        if engine_state == State.QUEUED and not self.sched.cancel(entry.key, now_ms=now_ms):
            entry.orphan = True
            if entry.future.done():  # cancelled with the client's task: a new one for whoever serves it
                entry.future = self.loop.create_future()
            return False
        if entry.orphan:
            outcome = Outcome.CANCELLED
        if served and engine_state == State.RUNNING:
            self.sched.complete(entry.key, now_ms=now_ms, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
            self.circuits.add_tokens(entry.backend or "", now_ms, prompt_tokens + output_tokens)
        elif engine_state == State.RUNNING:
            self.sched.fail(entry.key, now_ms=now_ms, reason=outcome)
        self._leave_backend(entry)
        self._finish(entry, outcome, now_ms)
        self.pump()
        return True

    def upstream_result(self, backend: str, *, ok: bool) -> None:
        """Feed the circuit breaker; opening or closing a circuit reconfigures the engine."""
        if ok:
            self.circuits.success(backend)
            return
        if self.circuits.failure(backend, self.now_ms()):
            log.warning("circuit open for backend %s for %d ms", backend, self.circuits.cooldown_ms)
            self._backends_changed()
            self.pump()

    def credential_refused(self, backend: str, detail: str) -> None:
        """The backend refused the gateway's credential: its circuit opens at once (not after
        ``threshold`` failures), and the log says why (never the key)."""
        log.error(
            "backend %s: upstream credential refused (%s); circuit open for %d ms; check its api_key_env",
            backend,
            detail,
            self.circuits.cooldown_ms,
        )
        if self.circuits.trip(backend, self.now_ms()):
            self._backends_changed()
            self.pump()

    def _leave_backend(self, entry: Entry) -> None:
        if entry.state == State.RUNNING and entry.backend:
            self.circuits.of(entry.backend).in_use -= 1

    def _finish(self, entry: Entry, outcome: str, now_ms: int) -> None:
        if entry.state == State.QUEUED:
            entry.waited_ms += max(0, now_ms - entry.queued_since_ms)
        entry.state = outcome
        self._entry_drop(entry)
        record = describe(entry, position=None)
        record["finished_at"] = timezone.now().isoformat()
        self._ended(entry.tenant, entry.public_id, record, now_ms)

    def _ended(self, tenant: str, public_id: str, record: dict, now_ms: int) -> None:
        """A finished request's record, for GET /v1/queue/{id} and the console (the terminal log)."""
        self.terminal.add(tenant, public_id, record, now_ms=now_ms)

    # --- the pump ------------------------------------------------------------------------

    def pump(self) -> None:
        sched = self.sched
        now_ms = self.now_ms()
        for request in sched.expire(now_ms=now_ms):
            entry = self._entry(request.id)
            if entry is not None:
                entry.waited_ms += max(0, now_ms - entry.queued_since_ms)
                if not entry.future.done():
                    entry.future.set_exception(queue_timeout_error(entry))
                self._finish(entry, ErrorCode.QUEUE_TIMEOUT, now_ms)
        for grant in sched.dispatch(now_ms=now_ms):
            self._granted(grant, now_ms)
        self._arm(now_ms)

    def _granted(self, grant: Grant, now_ms: int) -> None:
        entry = self._entry(grant.request.id)
        if entry is None or entry.future.done():  # nobody waits for it any more: free the slot
            self.sched.fail(grant.request.id, now_ms=now_ms, reason=Outcome.CANCELLED)
            return
        entry.state = State.RUNNING
        entry.backend = grant.backend
        entry.preempt = grant.preempt
        entry.boosted = grant.boosted
        entry.waited_ms += max(0, now_ms - entry.queued_since_ms)
        self.circuits.of(grant.backend).in_use += 1
        entry.future.set_result(grant)

    def _entry(self, key: str) -> Entry | None:
        tenant, _, public_id = key.partition("/")
        return self.live.get(tenant, {}).get(public_id)

    def _arm(self, now_ms: int) -> None:
        times = [t for t in (self.sched.next_wakeup_ms(now_ms=now_ms), self.circuits.next_change_ms()) if t is not None]
        when_ms = max(min(times), now_ms + 1) if times else None
        if when_ms == self._timer_at_ms and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at_ms = when_ms
        self._timer = None if when_ms is None else self.loop.call_at(when_ms / 1000 + 0.0005, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at_ms = None
        try:
            if self.circuits.reopen_due(self.now_ms()):
                self._backends_changed()
            self.pump()
        except Exception:
            log.exception("dispatcher timer failed")

    # --- reads ---------------------------------------------------------------------------

    def entries_of(self, tenant: str) -> list[Entry]:
        return list(self.live.get(tenant, {}).values())

    async def fresh(self) -> None:
        """Before a read of positions: the engine read is up to date (here it always is)."""

    def live_view(self, entry: Entry, now_ms: int) -> dict:
        """The queue API's and the console's view of one live request, with its wait so far. The
        engine's state decides (with the shared scheduler a grant reaches this process a moment
        after the engine made it: the request is shown running from then)."""
        state = self.sched.state_of(entry.key) or entry.state
        position = self.sched.position(entry.key, now_ms=now_ms) if state == State.QUEUED else None
        row = describe(entry, position=position, state=state)
        if entry.state == State.QUEUED:
            row["waited_ms"] = entry.waited_ms + max(0, now_ms - entry.queued_since_ms)
        return row

    def entry_of(self, tenant: str, public_id: str) -> Entry | None:
        return self.live.get(tenant, {}).get(public_id)


def describe(entry: Entry, *, position, state: str | None = None) -> dict:
    """The queue API's view of one request (``position`` is the engine's QueuePosition or None;
    ``state``: the engine's, where it is ahead of the entry's)."""
    state = state or entry.state
    eta_ms = None
    if position is not None and position.eta_ms >= 0:
        eta_ms = position.eta_ms
    elif state == State.RUNNING:
        eta_ms = 0
    return {
        "id": entry.public_id,
        "class": entry.cls,
        "declared_class": entry.declared_class,
        "downgrade_rule": entry.downgrade_rule,
        "state": str(state),  # plain text (an enum member would make the record a tracked object)
        "position": position.position if position is not None else None,
        "position_exact": position.exact if position is not None else None,
        "eta_ms": eta_ms,
        "waited_ms": entry.waited_ms,
        "model": entry.model,
        "backend": entry.backend,
        "job": entry.job,
    }
