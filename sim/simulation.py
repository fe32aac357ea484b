"""Discrete-event simulation of a scenario through the real engine ``Scheduler``.

The clock is virtual (integer ms); events sit in one heap and arrivals stream from the sorted
trace. At each instant the loop runs completions, arrivals, expiry, client give-ups and dispatch,
in that order, then asks ``sched.next_wakeup_ms`` for the next instant the engine needs. The
order and how give-ups and timeouts count: docs/simulator.md, "The event loop".
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Callable

from scheduling.engine import Scheduler
from scheduling.engine.model import Request
from scheduling.engine.presets import apply_policy
from sim.generators import TraceRequest
from sim.metrics import ClassStats, JainTracker, TenantStats, Timeline
from sim.scenario import Scenario

try:  # the downgrade-rule language; without it requests keep their declared class
    from scheduling.engine.rules import Facts, compile_rules
except ImportError:  # pragma: no cover - only while the rules module is missing
    Facts = compile_rules = None  # type: ignore[assignment,misc]

COMPLETE, WAKE, GIVE_UP = 0, 1, 2
WAITING, RUNNING, DONE = 0, 1, 2


class Flight:
    """The simulator's view of one admitted request."""

    __slots__ = ("trace", "cls", "state", "gave_up", "give_up_ms", "dispatched_ms")

    def __init__(self, trace: TraceRequest, cls: str, give_up_ms: int) -> None:
        self.trace = trace
        self.cls = cls
        self.state = WAITING
        self.gave_up = False
        self.give_up_ms = give_up_ms
        self.dispatched_ms = 0


class Simulation:
    def __init__(
        self,
        scenario: Scenario,
        *,
        policy: str | None = None,
        timeline_step_ms: int | None = None,
        progress: Callable[..., None] | None = None,
    ) -> None:
        config = scenario.config
        self.policy = policy or config.policy.value
        self.config = apply_policy(config, self.policy)
        self.scenario = scenario
        self.sched = Scheduler(self.config, tenants=scenario.tenants, backends=scenario.backends)
        self.sla_ms = {c.name: c.sla_ms for c in self.config.classes}
        self.tenant_specs = {t.slug: t for t in scenario.tenants}
        self.rules = self._compile_rules()
        self.classes = {c.name: ClassStats() for c in sorted(self.config.classes, key=lambda c: c.level)}
        self.tenants = {t.slug: TenantStats() for t in scenario.tenants}
        min_share = self.config.fairness.min_share
        self.jain = JainTracker(
            {t.slug: max(t.quota_share, min_share) for t in scenario.tenants}, scenario.jain_window_ms
        )
        self.timeline = Timeline(timeline_step_ms or scenario.timeline_step_ms)
        self.flights: dict[str, Flight] = {}
        self.events: list[tuple[int, int, int, str]] = []
        self.wakeups: set[int] = set()
        self.seq = 0
        self.in_queue = 0
        self.slot_ms = self.wasted_ms = 0
        self.good = self.downgraded = 0
        self.boosted = self.preempted = 0
        self.decisions_ns: list[float] = []
        self.timeout_wait_ms = {name: 0 for name in self.classes}  # client time spent on requests that got 504
        self.fast_failed = {name: 0 for name in self.classes}  # of those, ended before their deadline
        self.end_ms = 0
        self.progress = progress
        self.interactive = self._class_like("INTERACTIVE", first=True)
        self.batch = self._class_like("BATCH", first=False)
        self.horizon_ms = scenario.horizon_ms or self._default_horizon()

    # --- set-up helpers ------------------------------------------------------------------

    def _compile_rules(self):
        if compile_rules is None or not self.config.downgrade_rules:
            return None
        return compile_rules(self.config.downgrade_rules, self.config.networks, self.config.classes)

    def _class_like(self, name: str, *, first: bool) -> str:
        if name in self.sla_ms:
            return name
        ordered = sorted(self.config.classes, key=lambda c: c.level)
        return (ordered[0] if first else ordered[-1]).name

    def _default_horizon(self) -> int:
        top_sla = max(self.sla_ms.values())
        return max((r.at_ms + top_sla + r.service_ms for r in self.scenario.requests), default=1)

    def classify(self, r: TraceRequest) -> str:
        if self.rules is None:
            return r.declared
        spec = self.tenant_specs.get(r.tenant)
        facts = Facts(
            declared_class=r.declared,
            prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens if r.max_tokens is not None else r.output_tokens,
            tenant=r.tenant,
            src_ip=r.src_ip,
        )
        cls, _rule = self.rules.classify(declared=r.declared, facts=facts, allowed=spec.classes if spec else ())
        return cls

    # --- the event loop ------------------------------------------------------------------

    def push(self, t_ms: int, kind: int, rid: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t_ms, kind, self.seq, rid))

    def run(self) -> None:
        trace, n, i = self.scenario.requests, len(self.scenario.requests), 0
        events = self.events
        while i < n or (events and self.flights):  # left-over give-ups and wake-ups change nothing
            t = min(trace[i].at_ms if i < n else sys.maxsize, events[0][0] if events else sys.maxsize)
            self._before(t)
            batch: list[list[str]] = [[], [], []]
            while events and events[0][0] == t:
                _t, kind, _s, rid = heapq.heappop(events)
                batch[kind].append(rid)
            self.wakeups.discard(t)
            for rid in batch[COMPLETE]:
                self.on_complete(rid, t)
            while i < n and trace[i].at_ms == t:
                self.on_arrival(trace[i], t)
                i += 1
            self.on_expire(t)
            for rid in batch[GIVE_UP]:
                self.on_give_up(rid, t)
            self.on_dispatch(t)
            self._schedule_wakeup(t)
            self.end_ms = t
            if self.progress is not None:
                self.progress(i, n, t)
        self._finish()

    def _before(self, t_ms: int) -> None:
        self.jain.roll_until(t_ms)
        while self.timeline.due(t_ms):
            self.timeline.emit(self._timeline_state())

    def _finish(self) -> None:
        self.jain.roll_until(self.end_ms)
        while self.timeline.next_t_ms <= self.end_ms + self.timeline.step_ms - 1:
            self.timeline.emit(self._timeline_state())

    def _timeline_state(self) -> dict:
        return {
            "in_queue": self.in_queue,
            "batch_completed": self.classes[self.batch].completed,
            "aging_preempt": self.preempted,
            "rejected_queue_full": sum(c.rejected_queue_full for c in self.classes.values()),
        }

    def _schedule_wakeup(self, t_ms: int) -> None:
        wake = self.sched.next_wakeup_ms(now_ms=t_ms)
        if wake is None:
            return
        wake = max(wake, t_ms + 1)
        if wake not in self.wakeups:
            self.wakeups.add(wake)
            self.push(wake, WAKE, "")

    # --- event handlers ------------------------------------------------------------------

    def on_arrival(self, r: TraceRequest, t_ms: int) -> None:
        cls = self.classify(r)
        stats, tenant = self.classes[cls], self.tenants.setdefault(r.tenant, TenantStats())
        stats.arrived += 1
        tenant.arrived += 1
        if cls != r.declared:
            self.downgraded += 1
            stats.downgraded_in += 1
        spec = self.tenant_specs.get(r.tenant)
        expected = r.max_tokens if r.max_tokens is not None else r.output_tokens
        request = Request(
            id=r.id,
            tenant=r.tenant,
            cls=cls,
            model=r.model,
            prompt_tokens=r.prompt_tokens,
            expected_output_tokens=expected,
            enqueued_ms=t_ms,
            deadline_ms=t_ms + r.timeout_ms if r.timeout_ms is not None else None,
            vip=bool(spec and spec.vip),
        )
        started = time.perf_counter_ns()
        admission = self.sched.submit(request, now_ms=t_ms)
        self.decisions_ns.append(time.perf_counter_ns() - started)
        if not admission.admitted:
            tenant.rejected += 1
            if admission.reason == "queue_full":
                stats.rejected_queue_full += 1
            else:
                stats.rejected_no_backend += 1
            return
        stats.admitted += 1
        give_up_ms = self._give_up_ms(r, cls, t_ms)
        self.flights[r.id] = Flight(r, cls, give_up_ms)
        self.in_queue += 1
        self.jain.add_waiting((cls, r.tenant))
        self.push(give_up_ms, GIVE_UP, r.id)

    def _give_up_ms(self, r: TraceRequest, cls: str, t_ms: int) -> int:
        if r.patience_ms is not None:
            patience = r.patience_ms if r.timeout_ms is None else min(r.patience_ms, r.timeout_ms)
            return t_ms + patience
        limit = self.sla_ms[cls] if r.timeout_ms is None else min(self.sla_ms[cls], r.timeout_ms)
        return t_ms + limit + 1

    def _leave_queue(self, flight: Flight) -> None:
        self.in_queue -= 1
        self.jain.remove_waiting((flight.cls, flight.trace.tenant))

    def on_expire(self, t_ms: int) -> None:
        for request in self.sched.expire(now_ms=t_ms):
            flight = self.flights.pop(request.id)
            flight.state = DONE
            self._leave_queue(flight)
            self.classes[flight.cls].queue_timeout += 1
            self.tenants[flight.trace.tenant].queue_timeout += 1
            r = flight.trace
            self.timeout_wait_ms[flight.cls] += t_ms - r.at_ms
            limit_ms = self.sla_ms[flight.cls] if r.timeout_ms is None else min(self.sla_ms[flight.cls], r.timeout_ms)
            self.fast_failed[flight.cls] += t_ms <= r.at_ms + limit_ms  # expiry comes only after the deadline

    def on_give_up(self, rid: str, t_ms: int) -> None:
        flight = self.flights.get(rid)
        if flight is None or flight.state != WAITING:
            return
        if self.sched.cancel(rid, now_ms=t_ms):
            flight.state = DONE
            del self.flights[rid]
            self._leave_queue(flight)
            self.classes[flight.cls].abandoned += 1
            self.tenants[flight.trace.tenant].abandoned += 1
        else:
            flight.gave_up = True

    def on_dispatch(self, t_ms: int) -> None:
        started = time.perf_counter_ns()
        grants = self.sched.dispatch(now_ms=t_ms)
        if not grants:
            return
        per_grant = (time.perf_counter_ns() - started) / len(grants)
        self.decisions_ns.extend([per_grant] * len(grants))
        for grant in grants:
            self._start(grant, t_ms)

    def _start(self, grant, t_ms: int) -> None:
        flight = self.flights[grant.request.id]
        r = flight.trace
        flight.state, flight.dispatched_ms = RUNNING, t_ms
        self._leave_queue(flight)
        wait_ms = t_ms - r.at_ms
        self.classes[flight.cls].waits.append(wait_ms)
        self.tenants[r.tenant].waits.append(wait_ms)
        if flight.cls == self.interactive:
            self.timeline.step_interactive_waits.append(wait_ms)
        self.jain.served((flight.cls, r.tenant), r.prompt_tokens + r.output_tokens)
        self.boosted += bool(grant.boosted)
        self.preempted += bool(grant.preempt)
        self.slot_ms += r.service_ms
        if flight.gave_up:
            self.wasted_ms += r.service_ms
            self.classes[flight.cls].served_after_give_up += 1
        self.push(t_ms + r.service_ms, COMPLETE, r.id)

    def on_complete(self, rid: str, t_ms: int) -> None:
        flight = self.flights.pop(rid)
        r = flight.trace
        self.sched.complete(rid, now_ms=t_ms, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens)
        flight.state = DONE
        stats = self.classes[flight.cls]
        stats.completed += 1
        within_sla = flight.dispatched_ms - r.at_ms <= self.sla_ms[flight.cls]
        stats.completed_within_sla += within_sla
        tenant = self.tenants[r.tenant]
        tenant.completed += 1
        tenant.tokens_served += r.prompt_tokens + r.output_tokens
        if within_sla and not flight.gave_up and flight.dispatched_ms < flight.give_up_ms and t_ms <= self.horizon_ms:
            self.good += 1


def progress_bar(label: str, *, stream=sys.stderr, every_s: float = 0.5) -> Callable[..., None]:
    """A ``\\r`` progress line: share of the trace that has arrived and the virtual clock."""
    last = [time.monotonic()]

    def show(done: int, total: int, t_ms: int, force: bool = False) -> None:
        now = time.monotonic()
        if now - last[0] < every_s and not force:
            return
        last[0] = now
        share = done / total if total else 1.0
        bar = "#" * int(share * 30)
        stream.write(f"\r{label} [{bar:<30}] {share:6.1%} t={t_ms / 1000:9.0f}s")
        stream.flush()

    return show


def simulate(
    scenario: Scenario,
    *,
    policy: str | None = None,
    timeline_step_ms: int | None = None,
    progress: Callable[..., None] | None = None,
) -> Simulation:
    sim = Simulation(scenario, policy=policy, timeline_step_ms=timeline_step_ms, progress=progress)
    sim.run()
    return sim
