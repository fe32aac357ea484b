"""The gateway's dispatcher with the shared scheduler (``FAIRGATE_SCHEDULER=shared``).

The same `DispatchCore` as the embedded dispatcher, but its engine calls become commands to the
one dispatcher that holds the lease (scheduling.shared), and its reads come from this process's
replica of the shared engine. The process also bids for the dispatcher's role
(``FAIRGATE_DISPATCHER``), reports upstream failures for the shared circuits and renews the
leases of its running requests with its heartbeat. How it works: docs/shared-scheduler.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from django.conf import settings

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
from gateway.ended_shared import EndedStream
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle import Outcome, PublicId, State, engine_id, public_id_of
from gateway.port import QueueView
from scheduling.engine import Grant, Scheduler, apply_policy
from scheduling.engine.model import Request, RequestId, SchedulerConfig
from scheduling.engine.outcomes import Live
from scheduling.shared.bell import sleep_or
from scheduling.shared.client import Client, connect
from scheduling.shared.owner import Owner, owner_id
from scheduling.shared.protocol import RENEW_MAX, RUN_LEASE_MS, Answer, Command, submit
from scheduling.shared.replica import Keys, entries, id_key

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)
ANSWER_LIMIT_S = 10.0  # no dispatcher answered a submit for this long: 503
FRESH_LIMIT_S = 0.5  # a read waits this long at most for the replica to catch up
CLOSE_WITHIN_S = 15.0  # above the socket timeout (10 s): a task reading from a Redis gone silent ends too


def _redis() -> Redis:
    url = settings.REDIS_URL
    assert url, "FAIRGATE_SCHEDULER=shared needs REDIS_URL (config.settings refuses to start without it)"
    return connect(url)


def _no_answer(answer: asyncio.Future[Answer]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


class SharedDispatcher(OnCore):
    """The scheduler's port (gateway.port) on the engine every gateway process shares."""

    def __init__(self, config: SchedulerConfig, *, audit_pk: int | None, loop: asyncio.AbstractEventLoop) -> None:
        self._hold_core(config, audit_pk=audit_pk, loop=loop)
        core = self.core
        # Read until the first step is replayed; changed only by this process's configuration.
        self._placeholder = Scheduler(
            apply_policy(config, config.policy), tenants=config.tenants or (), backends=self._effective_backends()
        )
        self.redis = _redis()
        keys = Keys(settings.FAIRGATE_SHARED_PREFIX)
        self.gateway_id = owner_id()  # host:pid:nonce, as the dispatcher's role is named
        self.owner = Owner(self.redis, config, keys=keys, name=self.gateway_id)
        core.also_open = self._circuit_open_at_dispatcher
        self.client = Client(self.redis, self.gateway_id, keys=keys)
        self.client.on_answer = self._answer
        self.client.on_beat = self._renew_running
        self.owner.attach(self.client)  # while this process holds the role, its commands skip Redis
        self._admissions: dict[str, asyncio.Future[Answer]] = {}
        self._requests: dict[str, Request] = {}
        self._honour_cancel = apply_policy(config, config.policy).queue.honour_cancel
        self._stop = asyncio.Event()
        self._answers: asyncio.Task[None] | None = None
        self._role: asyncio.Task[None] | None = None
        self._elsewhere: asyncio.Future[Grant] = loop.create_future()  # the future of other processes' requests
        self.ended = EndedStream(
            self.redis,
            keys.ended,
            gateway=self.gateway_id,
            keep_ms=settings.FAIRGATE_TERMINAL_KEEP_MS,
            max_entries=settings.FAIRGATE_TERMINAL_MAX,
        )
        self._ended_follower: asyncio.Task[None] | None = None
        self.demand_store = DemandStore(wall_offset_ms=0)  # written by the process that holds the lease

    @classmethod
    async def create(cls) -> SharedDispatcher:
        audit_pk, config = await startup()
        dispatcher = cls(config, audit_pk=audit_pk, loop=asyncio.get_running_loop())
        dispatcher.core.poll_start(dispatcher.apply_config, dispatcher.pump, dispatcher.keep_demand)
        await dispatcher.owner.load()
        dispatcher._start()
        return dispatcher

    def _start(self) -> None:
        self._answers = self.loop.create_task(self.client.run(self._stop), name="fairgate-shared-answers")
        self._ended_follower = self.loop.create_task(
            self.ended.follow(self._ended_elsewhere, now_ms=self.now_ms(), stop=self._stop),
            name="fairgate-shared-ended",
        )
        if settings.FAIRGATE_DISPATCHER == "auto":  # a standby follows the steps until it holds the lease
            self._role = self.loop.create_task(self.owner.run(stop=self._stop), name="fairgate-shared-owner")
        else:
            self._role = self.loop.create_task(self._follow(), name="fairgate-shared-replica")

    async def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                await self.owner.follow(block_ms=1000)
            except Exception:
                log.exception("the replica of the shared scheduler could not follow; retrying")
                await sleep_or(self._stop, 1)

    async def close(self) -> None:
        """Stops the tasks on Redis by their event (the owner ends its step and gives its lease
        back: a standby takes over at once), each ending within one blocking read; one that has
        not ended in `CLOSE_WITHIN_S` (Redis out of reach) is cancelled. Not by cancelling first:
        see `Client.run`."""
        if self.owner.owns and self.owner.sched is not None:
            try:
                await self.demand_store.save(self.owner.sched)
            except Exception:
                log_failure(log, "the demand profile could not be stored at close")
        self._stop.set()
        tasks = [task for task in (self._role, self._answers, self._ended_follower) if task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=CLOSE_WITHIN_S)
            for task in late:
                log.warning("%s did not end in %s s; cancelled", task.get_name(), CLOSE_WITHIN_S)
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.ended.close()
        await self.core.close()
        await self.redis.aclose()

    # --- finished requests: every process's, in each one's terminal log ------------------------

    def _finish(self, entry: Entry, outcome: str, now_ms: int) -> None:
        record = self.core.finish(entry, outcome, now_ms)
        self.ended.publish(entry.tenant, entry.public_id, record)

    def _ended_elsewhere(self, tenant: str, public_id: str, record: dict, ended_ms: int) -> None:
        """Another process's finished request (gateway.ended_shared)."""
        self.terminal.add(tenant, public_id, record, now_ms=ended_ms)

    # --- the engine: the shared one's replica, for reads ---------------------------------------

    @property
    def sched(self) -> Scheduler:
        """The shared engine as of the last step this process replayed (before any: an empty one)."""
        replica = self.owner.sched
        return self._placeholder if replica is None else replica

    def now_ms(self) -> int:
        return int(time.time() * 1000)  # the shared engine's clock (scheduling.shared.owner)

    def apply_config(self, config: SchedulerConfig) -> None:
        self.core.take(config)
        self._reconfigure_placeholder(
            config=apply_policy(config, config.policy),
            tenants=config.tenants or (),
            backends=self._effective_backends(),
        )
        self._honour_cancel = apply_policy(config, config.policy).queue.honour_cancel
        self.owner.configure(config)  # the dispatcher logs it with its next step, for every replica

    def _reconfigure_placeholder(self, **changes) -> None:
        """Only this process's placeholder engine (read before the first step): the shared engine
        and its replicas change by the dispatcher's logged steps alone, or they would drift apart."""
        self._placeholder.reconfigure(now_ms=self.now_ms(), **changes)

    def pump(self) -> None:
        """The dispatcher pumps (scheduling.shared.owner); nothing to do here."""

    def keep_demand(self) -> None:
        """While this process holds the lease: the engine's demand profile to the database when it
        learned a bucket (gateway.demand_store); not read back here (docs/engine.md, "Foreseen demand")."""
        if self.owner.owns and self.owner.sched is not None:
            self.demand_store.tick(self.owner.sched)

    # --- circuits ----------------------------------------------------------------------------

    def check_model(self, model: str, *, embeddings: bool = False) -> None:
        self.core.check_model(model, embeddings=embeddings, now_ms=self.now_ms())

    def serves_now(self, model: str) -> bool:
        return self.core.serves_now(model, self.now_ms())

    def circuit_open(self, backend: str, now_ms: int) -> bool:
        return self.core.circuit_open(backend, now_ms)

    def _circuit_open_at_dispatcher(self, backend: str, now_ms: int) -> bool:
        return self.owner.routes.circuits.is_open(backend, now_ms)

    def upstream_result(self, backend: str, *, ok: bool) -> None:
        if self.core.upstream_result(backend, ok=ok, now_ms=self.now_ms()):
            self._reconfigure_placeholder(backends=self._effective_backends())
        if not ok:  # successes reach the dispatcher as completions
            self._send(["upstream", backend, False, self.circuits.threshold, self.circuits.cooldown_ms])

    def credential_refused(self, backend: str, detail: str) -> None:
        if self.core.credential_refused(backend, detail, self.now_ms()):
            self._reconfigure_placeholder(backends=self._effective_backends())
        self._send(["upstream", backend, False, 1, self.circuits.cooldown_ms])  # threshold 1: open at once

    # --- commands ----------------------------------------------------------------------------

    def _send(self, command: Command) -> None:
        if not self.owner.offer(command):
            self.client.send(command)

    def _renew_running(self) -> None:
        """Renews the leases of this process's running requests (with each heartbeat)."""
        running = [entry.key for live in self.live.values() for entry in live.values() if entry.state == State.RUNNING]
        for at in range(0, len(running), RENEW_MAX):
            self._send(["renew", self.gateway_id, running[at : at + RENEW_MAX]])

    def claim(self, key: RequestId, *, tenant: str, public_id: str) -> None:
        self.core.claim(key, tenant=tenant, public_id=public_id)

    def unclaim(self, key: RequestId) -> None:
        self.core.unclaim(key)

    async def admit(self, request: Request, *, public_id: str, declared_class: str, rule: str | None) -> Entry:
        """Submit to the shared engine; answered asynchronously by the dispatcher."""
        if self.core.is_live(request.tenant, public_id):
            raise id_in_use(public_id)
        entry = self.core.entry_new(request, public_id, declared_class, rule, self.now_ms())  # before any answer
        self._requests[request.id] = request
        answer: asyncio.Future[Answer] = self.loop.create_future()
        self._admissions[request.id] = answer
        # The answer is awaited directly, its limit a timer that fails it: wait_for and shield would
        # each add a turn of the event loop between the answer and this request going on.
        limit = self.loop.call_later(ANSWER_LIMIT_S, _no_answer, answer)
        timeout_ms = None if request.deadline_ms is None else max(1, request.deadline_ms - request.enqueued_ms)
        self._send(
            submit(
                self.gateway_id,
                request.id,
                tenant=request.tenant,
                cls=request.cls,
                model=request.model,
                prompt_tokens=request.prompt_tokens,
                expected_output_tokens=request.expected_output_tokens,
                timeout_ms=timeout_ms,
                vip=request.vip,
                job=request.job,
            )
        )
        try:
            kind, _rid, *rest = await answer
        except BaseException as failed:  # the client left, or no dispatcher answers: it is given up
            self._admissions.pop(request.id, None)
            self.end(entry, Outcome.CANCELLED)
            if isinstance(failed, TimeoutError):
                raise GatewayError(
                    503, ErrorCode.NO_BACKEND, "The scheduler is not answering; retry shortly."
                ) from None
            raise
        finally:
            limit.cancel()
        if kind == "admitted":
            return entry
        self.core.entry_drop(entry)  # a refused request leaves no trace (as the embedded one never had an entry)
        self._requests.pop(request.id, None)
        reason, retry_after_ms = rest
        if reason == "id_in_use":
            raise id_in_use(public_id)
        raise admission_refused(request, reason, retry_after_ms)

    async def wait_for_grant(self, entry: Entry) -> Grant:
        """The next grant of ``entry`` (see `gateway.dispatcher.Dispatcher.wait_for_grant`)."""
        return await entry.future

    def requeue(self, entry: Entry, *, retry_after_ms: int) -> None:
        self.core.requeued(entry, self.now_ms())
        self._send(["requeue", entry.key, max(0, retry_after_ms)])

    def end(
        self, entry: Entry, outcome: str, *, prompt_tokens: int = 0, output_tokens: int = 0, served: bool = False
    ) -> bool:
        """Final state of a request (idempotent; see `gateway.dispatcher.Dispatcher.end`)."""
        if entry.state not in (State.QUEUED, State.RUNNING):
            return True
        now_ms = self.now_ms()
        if entry.state == State.QUEUED:
            if not self._honour_cancel:  # the policy serves it anyway (fifo): for nobody, when granted
                self.core.orphaned(entry)
                return False
            self._send(["cancel", entry.key])
        elif served:
            self._send(["complete", entry.key, prompt_tokens, output_tokens])
            self.circuits.add_tokens(entry.backend or "", now_ms, prompt_tokens + output_tokens)
        else:
            self._send(["fail", entry.key, str(outcome)])
        if entry.orphan:
            outcome = Outcome.CANCELLED
        self.core.leave_backend(entry)
        self._finish(entry, outcome, now_ms)
        self._requests.pop(entry.key, None)
        return True

    # --- answers -----------------------------------------------------------------------------

    def _answer(self, answer: Answer) -> None:
        kind, rid = answer[0], answer[1]
        if kind in ("admitted", "refused"):
            waiting = self._admissions.pop(rid, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(answer)
            elif kind == "admitted":  # nobody waits any more (gave up): it goes
                self._send(["cancel", rid])
            return
        entry = self.core.entry(RequestId(rid))
        if kind == "granted":
            _, _, backend, waited_ms, preempt, boosted = answer
            self._granted_shared(rid, entry, backend, waited_ms, preempt, boosted)
        elif kind == "expired" and entry is not None and entry.state == State.QUEUED:
            entry.waited_ms = answer[2]
            if not entry.future.done():
                entry.future.set_exception(queue_timeout_error(entry))
            self._finish(entry, ErrorCode.QUEUE_TIMEOUT, self.now_ms())
            self._requests.pop(rid, None)
        elif kind == "reclaimed":  # a bug, or this process's loop held past the lease: loud
            state = "unknown here" if entry is None else entry.state
            log.warning("request %s (%s): not renewed for %d ms, its slot was taken back", rid, state, RUN_LEASE_MS)

    def _granted_shared(
        self, rid: str, entry: Entry | None, backend: str, waited_ms: int, preempt: bool, boosted: bool
    ) -> None:
        request = self._requests.get(rid)
        if entry is None or request is None or entry.state != State.QUEUED or entry.future.done():
            self._send(["fail", rid, str(Outcome.CANCELLED)])  # nobody waits for it: the slot goes back
            return
        entry.waited_ms = waited_ms
        self.core.granted(entry, backend, preempt=preempt, boosted=boosted)
        entry.future.set_result(Grant(request, backend, waited_ms, preempt, boosted))

    # --- reads: every process's requests -------------------------------------------------------

    def queue_view(self) -> QueueView:
        return QueueView(self.sched, self.core)

    def live_view(self, entry: Entry, now_ms: int) -> dict:
        return live_view(self.sched, entry, now_ms)

    def entries_of(self, tenant: str) -> list[Entry]:
        """``tenant``'s live requests through every gateway process: this one's entries, and, from
        the shared engine's replica, those of the others (with what the engine knows of them: no
        declared class or downgrade rule of their own)."""
        own = self.core.entries_of(tenant)
        replica = self.owner.sched
        if replica is None:
            return own
        mine = {entry.key for entry in own}
        return own + [self._seen(live) for live in replica.requests_of(tenant) if live.request.id not in mine]

    async def fresh(self) -> None:
        """Waits (`FRESH_LIMIT_S` at most) until this standby's replica has replayed every step
        committed so far: its follower replays them as they come, so this is milliseconds. (The
        owner's engine is the shared one itself.)"""
        owner = self.owner
        if owner.owns:
            return
        newest = entries(await self.redis.xrevrange(owner.keys.steps, count=1))
        if not newest:
            return
        target = id_key(newest[0][0])
        until = self.loop.time() + FRESH_LIMIT_S
        while not owner.owns and id_key(owner.last_step) < target and self.loop.time() < until:
            await asyncio.sleep(0.005)

    def entry_of(self, tenant: str, public_id: str) -> Entry | None:
        entry = self.core.entry_of(tenant, public_id)
        replica = self.owner.sched
        if entry is not None or replica is None:
            return entry
        live = replica.live(engine_id(tenant, PublicId(public_id)))
        return None if live is None else self._seen(live)

    def _seen(self, live: Live) -> Entry:
        """Another process's request as this one shows it (a view: nothing waits on it here)."""
        request = live.request
        running = live.state == "running"
        return Entry(
            key=request.id,
            public_id=public_id_of(request.id),
            tenant=request.tenant,
            model=request.model,
            cls=request.cls,
            declared_class=request.cls,
            downgrade_rule=None,
            queued_since_ms=request.enqueued_ms,
            future=self._elsewhere,
            state=State.RUNNING if running else State.QUEUED,
            waited_ms=max(0, (live.dispatched_ms or request.enqueued_ms) - request.enqueued_ms) if running else 0,
            backend=live.backend,
            job=request.job,
        )
