"""The embedded dispatcher: one per process, owner of the engine's Scheduler.

Everything here runs on the event loop thread and never awaits while it touches the engine,
so the (synchronous) engine needs no lock. A *pump* — expire, dispatch, resolve the waiters'
futures, re-arm one timer for ``next_wakeup_ms`` — runs after every submit, completion,
cancel and requeue, and when the timer fires. Its `DispatchCore` polls the configuration
(latest audit row), handed to ``Scheduler.reconfigure`` here, and writes downgrade events.

Engine request ids are ``<tenant>/<public id>``: a client's own ``X-Request-Id`` is unique per
tenant, not globally.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.db import log_failure
from gateway.demand_store import DemandStore
from gateway.dispatch_core import (
    Entry,
    OnCore,
    admission_refused,
    id_in_use,
    live_view,
    queue_timeout_error,
    startup,
)
from gateway.errors import ErrorCode
from gateway.lifecycle import Outcome, State
from gateway.port import QueueView
from scheduling.engine import Grant, Scheduler
from scheduling.engine.model import Request, RequestId, SchedulerConfig
from scheduling.engine.presets import apply_policy

log = logging.getLogger(__name__)


class Dispatcher(OnCore):
    """The scheduler's port (gateway.port) on an engine of this process's own."""

    def __init__(self, config: SchedulerConfig, *, audit_pk: int | None, loop: asyncio.AbstractEventLoop) -> None:
        self._hold_core(config, audit_pk=audit_pk, loop=loop)
        self.wall_offset_ms = int(time.time() * 1000) - int(loop.time() * 1000)  # engine clock to epoch ms
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_ms: int | None = None
        self.sched = Scheduler(
            apply_policy(config, config.policy), tenants=config.tenants or (), backends=self._effective_backends()
        )
        self.demand_store = DemandStore(wall_offset_ms=self.wall_offset_ms)

    # --- life cycle ----------------------------------------------------------------------

    @classmethod
    async def create(cls) -> Dispatcher:
        audit_pk, config = await startup()
        dispatcher = cls(config, audit_pk=audit_pk, loop=asyncio.get_running_loop())
        try:
            await dispatcher.demand_store.load(dispatcher.sched)
        except Exception:
            log_failure(log, "the stored demand profile could not be read")
        dispatcher.core.poll_start(dispatcher.apply_config, dispatcher.pump, dispatcher.keep_demand)
        return dispatcher

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self.core.close()
        try:
            await self.demand_store.save(self.sched)
        except Exception:
            log_failure(log, "the demand profile could not be stored at close")

    def keep_demand(self) -> None:
        """The engine's demand profile to the database when it learned a bucket (gateway.demand_store)."""
        self.demand_store.tick(self.sched)

    def now_ms(self) -> int:
        return int(self.loop.time() * 1000)

    # --- configuration -------------------------------------------------------------------

    def apply_config(self, config: SchedulerConfig) -> None:
        self.core.take(config)
        self._reconfigure_engine(
            config=apply_policy(config, config.policy),
            tenants=config.tenants or (),
            backends=self._effective_backends(),
        )

    def _reconfigure_engine(self, **changes) -> None:
        """The engine takes a new configuration, tenants or backends."""
        self.sched.reconfigure(now_ms=self.now_ms(), **changes)
        self.pump()

    def _backends_changed(self) -> None:
        self._reconfigure_engine(backends=self._effective_backends())

    # --- admission -----------------------------------------------------------------------

    def check_model(self, model: str, *, embeddings: bool = False) -> None:
        self.core.check_model(model, embeddings=embeddings, now_ms=self.now_ms())

    def serves_now(self, model: str) -> bool:
        return self.core.serves_now(model, self.now_ms())

    def circuit_open(self, backend: str, now_ms: int) -> bool:
        return self.core.circuit_open(backend, now_ms)

    def claim(self, key: RequestId, *, tenant: str, public_id: str) -> None:
        self.core.claim(key, tenant=tenant, public_id=public_id)

    def unclaim(self, key: RequestId) -> None:
        self.core.unclaim(key)

    async def admit(self, request: Request, *, public_id: str, declared_class: str, rule: str | None) -> Entry:
        return self.admit_now(request, public_id=public_id, declared_class=declared_class, rule=rule)

    def admit_now(self, request: Request, *, public_id: str, declared_class: str, rule: str | None) -> Entry:
        """Submit to the engine; the entry's future resolves with a Grant or a GatewayError."""
        if self.core.is_live(request.tenant, public_id) or self.sched.state_of(request.id) is not None:
            raise id_in_use(public_id)
        admission = self.sched.submit(request, now_ms=request.enqueued_ms)
        if not admission.admitted:
            raise admission_refused(request, admission.reason, admission.retry_after_ms)
        entry = self.core.entry_new(request, public_id, declared_class, rule, request.enqueued_ms)
        self.pump()
        return entry

    async def wait_for_grant(self, entry: Entry) -> Grant:
        """The next grant of ``entry`` (a slot on a backend); raises its refusal (queue timeout, the
        backend gone). Ask again after a requeue: each wait is for the grant in force then (the
        dispatcher keeps one future per wait on the entry; its readers never hold one)."""
        return await entry.future

    # --- outcomes ------------------------------------------------------------------------

    def requeue(self, entry: Entry, *, retry_after_ms: int) -> None:
        """Upstream 429 (or a retried failure): back to the front of its queue, not charged."""
        now_ms = self.now_ms()
        self.core.requeued(entry, now_ms)
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
            self.core.orphaned(entry)
            return False
        if entry.orphan:
            outcome = Outcome.CANCELLED
        if served and engine_state == State.RUNNING:
            self.sched.complete(entry.key, now_ms=now_ms, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
            self.circuits.add_tokens(entry.backend or "", now_ms, prompt_tokens + output_tokens)
        elif engine_state == State.RUNNING:
            self.sched.fail(entry.key, now_ms=now_ms, reason=outcome)
        self.core.leave_backend(entry)
        self.core.finish(entry, outcome, now_ms)
        self.pump()
        return True

    def upstream_result(self, backend: str, *, ok: bool) -> None:
        """Feed the circuit breaker; opening or closing a circuit reconfigures the engine."""
        if self.core.upstream_result(backend, ok=ok, now_ms=self.now_ms()):
            self._backends_changed()
            self.pump()

    def credential_refused(self, backend: str, detail: str) -> None:
        if self.core.credential_refused(backend, detail, self.now_ms()):
            self._backends_changed()
            self.pump()

    # --- the pump ------------------------------------------------------------------------

    def pump(self) -> None:
        sched = self.sched
        now_ms = self.now_ms()
        for request in sched.expire(now_ms=now_ms):
            entry = self.core.entry(request.id)
            if entry is not None:
                entry.waited_ms += max(0, now_ms - entry.queued_since_ms)
                if not entry.future.done():
                    entry.future.set_exception(queue_timeout_error(entry))
                self.core.finish(entry, ErrorCode.QUEUE_TIMEOUT, now_ms)
        for grant in sched.dispatch(now_ms=now_ms):
            self._granted(grant, now_ms)
        self._arm(now_ms)

    def _granted(self, grant: Grant, now_ms: int) -> None:
        entry = self.core.entry(grant.request.id)
        if entry is None or entry.future.done():  # nobody waits for it any more: free the slot
            self.sched.fail(grant.request.id, now_ms=now_ms, reason=Outcome.CANCELLED)
            return
        entry.waited_ms += max(0, now_ms - entry.queued_since_ms)
        self.core.granted(entry, grant.backend, preempt=grant.preempt, boosted=grant.boosted)
        entry.future.set_result(grant)

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

    def queue_view(self) -> QueueView:
        return QueueView(self.sched, self.core)

    def entries_of(self, tenant: str) -> list[Entry]:
        return self.core.entries_of(tenant)

    def entry_of(self, tenant: str, public_id: str) -> Entry | None:
        return self.core.entry_of(tenant, public_id)

    async def fresh(self) -> None:
        """Before a read of positions: the engine read is up to date (here it always is)."""

    def live_view(self, entry: Entry, now_ms: int) -> dict:
        return live_view(self.sched, entry, now_ms, wall_offset_ms=self.wall_offset_ms)
