"""Property tests over random operation sequences on a virtual clock."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import FairnessMode, TenantSpec, apply_policy
from tests.unit.engine.engine_helpers import backend, config, req, scheduler, tenants, with_sla

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLASS_NAMES = ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY")
TENANTS = ("a", "b", "c")


def short_sla_config(
    policy: str = "fairgate",
    fairness=FairnessMode.WEIGHTED_FAIR_TOKENS,
    depth: bool = True,
    admission: str | None = None,
):
    """The test classes' short SLAs; ``admission`` names the rule (None: the default, ``predicted``)."""
    queue = {} if admission is None else {"admission": admission}
    cfg = config(fairness=fairness, enforce_depth=depth, service_ms_prior=200, **queue)
    for name, sla in (("INTERACTIVE", 600), ("NEAR_RT", 1500), ("BATCH", 4000), ("RETRY", 8000)):
        cfg = with_sla(cfg, name, sla)
    return apply_policy(cfg, policy)


def submits(
    count: tuple[int, int] = (1, 12), classes: Sequence[str] = CLASS_NAMES, sla: tuple[int, int] = (50, 5000)
) -> st.SearchStrategy[tuple]:
    """A "submit" op: (count, tenant, class, prompt tokens, service ms, deadline ms or None)."""
    return st.tuples(
        st.just("submit"),
        st.integers(*count),
        st.sampled_from(TENANTS),
        st.sampled_from(classes),
        st.sampled_from([50, 400, 1500, 3000]),
        st.integers(1, 1000),
        st.one_of(st.none(), st.integers(*sla)),
    )


submit_op = submits()
complete_op = st.tuples(st.just("complete"), st.integers(0, 50), st.integers(0, 3000))
advance_op = st.tuples(st.just("advance"), st.integers(1, 700))


def op_lists(
    reconfigure: Sequence[str],
    submit: st.SearchStrategy = submit_op,
    advance: st.SearchStrategy = advance_op,
    repeat: int = 3,
) -> st.SearchStrategy[list]:
    """Random op sequences: ``submit`` and ``advance`` ``repeat`` times as likely as each other op,
    reconfiguring to one of ``reconfigure``."""
    return st.lists(
        st.one_of(
            *[submit] * repeat,
            *[advance] * repeat,
            complete_op,
            st.tuples(st.just("fail"), st.integers(0, 50)),
            st.tuples(st.just("requeue"), st.integers(0, 50), st.integers(0, 400)),
            st.tuples(st.just("cancel"), st.integers(0, 50)),
            st.tuples(st.just("reconfigure"), st.sampled_from(list(reconfigure))),
        ),
        min_size=20,
        max_size=120,
    )


ops = op_lists(["fairgate", "strict", "linear", "fifo", "wrr", "sla"])


overload_ops = st.lists(
    st.one_of(  # bursts faster than service: requests reach the preempt bound
        submit_op,
        st.tuples(st.just("advance"), st.integers(5, 120)),
    ),
    min_size=30,
    max_size=120,
)
any_ops = st.one_of(ops, overload_ops)


class Harness:
    """Drives a scheduler and checks the invariants after every step."""

    def __init__(self, policy: str = "fairgate", depth: bool = True, admission: str | None = None) -> None:
        self.depth = depth
        self.admission = admission
        self.sched = scheduler(
            short_sla_config(policy, depth=depth, admission=admission),
            backends=[backend("g1", slots=6, tpm=200_000), backend("g2", slots=1, reserved_slots=1)],
            tenant_specs=[TenantSpec("a", 0.6), TenantSpec("b", 0.3), TenantSpec("c", 0.1, vip=True)],
        )
        self.now = 0
        self.next_id = 0
        self.admitted: set[str] = set()
        self.terminal: dict[str, str] = {}
        self.log: list[tuple] = []
        self.started: dict[str, int] = {}
        self.strict_preempt = False  # uniform capacity: check nothing stays at preempt after a plain grant

    def apply(self, op: tuple) -> None:
        getattr(self, "op_" + op[0])(*op[1:])
        self.tick()

    def op_submit(self, count, tenant, cls, prompt, out, timeout):
        for _ in range(count):
            rid = f"r{self.next_id}"
            self.next_id += 1
            request = req(
                rid,
                tenant=tenant,
                cls=cls,
                at=self.now,
                prompt=prompt,
                out=out,
                deadline=None if timeout is None else self.now + timeout,
            )
            result = self.sched.submit(request, now_ms=self.now)
            self.log.append(("submit", rid, result.admitted, result.reason))
            if result.admitted:
                self.admitted.add(rid)

    def op_advance(self, dt):
        """Move the clock, stopping at every completion (service = prompt/10 ms) and wake-up."""
        target = self.now + dt
        while True:
            ends = [r.id for r in self.sched.running() if self.started[r.id] + r.prompt_tokens // 10 <= target]
            wake = self.sched.next_wakeup_ms(now_ms=self.now)
            stops = [self.started[rid] + self.sched_request(rid).prompt_tokens // 10 for rid in ends]
            if wake is not None and wake <= target:
                stops.append(wake)
            stops = [max(t, self.now) for t in stops]
            if not stops:
                break
            self.now = min(stops)
            for r in self.sched.running():
                if self.started[r.id] + r.prompt_tokens // 10 <= self.now:
                    self.sched.complete(r.id, now_ms=self.now, prompt_tokens=r.prompt_tokens, output_tokens=1)
                    self.end(r.id, "completed")
            self.tick()
        self.now = target

    def sched_request(self, rid):
        return next(r for r in self.sched.running() if r.id == rid)

    def _running(self, k):
        running = self.sched.running()
        return running[k % len(running)] if running else None

    def op_complete(self, k, out):
        r = self._running(k)
        if r is not None:
            self.sched.complete(r.id, now_ms=self.now, prompt_tokens=r.prompt_tokens, output_tokens=out)
            self.end(r.id, "completed")

    def op_fail(self, k):
        r = self._running(k)
        if r is not None:
            self.sched.fail(r.id, now_ms=self.now)
            self.end(r.id, "failed")

    def op_requeue(self, k, retry_after):
        r = self._running(k)
        if r is not None:
            self.sched.requeue(r.id, now_ms=self.now, backend_retry_after_ms=retry_after)

    def op_cancel(self, k):
        waiting = self.sched.waiting()
        if waiting and self.sched.cancel(waiting[k % len(waiting)].id, now_ms=self.now):
            self.end(waiting[k % len(waiting)].id, "cancelled")

    def op_reconfigure(self, variant):
        before = {r.id for r in self.sched.waiting()}
        rule = {"depth": self.depth, "admission": self.admission}
        if variant == "wrr":
            cfg = short_sla_config(fairness=FairnessMode.WEIGHTED_ROUND_ROBIN, **rule)
        elif variant == "sla":
            cfg = with_sla(short_sla_config(**rule), "BATCH", 2500)
        else:
            cfg = short_sla_config(variant, **rule)
        self.sched.reconfigure(now_ms=self.now, config=cfg)
        assert {r.id for r in self.sched.waiting()} == before  # nothing lost

    def end(self, rid, outcome):
        assert rid in self.admitted and rid not in self.terminal, rid
        self.terminal[rid] = outcome
        self.log.append((outcome, rid, self.now))

    def tick(self):
        sched = self.sched
        for r in sched.expire(now_ms=self.now):
            self.end(r.id, "queue_timeout")
        grants = sched.dispatch(now_ms=self.now)
        seen_plain = False
        for g in grants:
            rid = g.request.id
            assert rid in self.admitted and rid not in self.terminal
            self.log.append(("grant", rid, g.backend, self.now, g.preempt, g.boosted))
            self.started[rid] = self.now
            deadline = min(
                g.request.enqueued_ms + sched._class_spec(g.request.cls).sla_ms,
                g.request.deadline_ms if g.request.deadline_ms is not None else 1 << 62,
            )
            if sched._config.queue.enforce_deadline:
                assert self.now <= deadline  # never dispatched past its deadline
            assert not (g.preempt and seen_plain)  # preempt grants come first in a round
            seen_plain = seen_plain or not g.preempt
        if self.strict_preempt:
            at_preempt = [
                r for r in sched.waiting() if self.now - r.enqueued_ms >= 0.95 * sched._class_spec(r.cls).sla_ms
            ]
            assert not (seen_plain and at_preempt)
        self.check_conservation()

    def edf_key(self, r):
        deadline = r.enqueued_ms + self.sched._class_spec(r.cls).sla_ms
        if r.deadline_ms is not None:
            deadline = min(deadline, r.deadline_ms)
        return (deadline, self.sched._class_spec(r.cls).level, r.enqueued_ms, r.id)

    def check_conservation(self):
        sched = self.sched
        waiting = {r.id for r in sched.waiting()}
        running = {r.id for r in sched.running()}
        assert not waiting & running
        assert waiting | running | set(self.terminal) == self.admitted
        assert not (waiting | running) & set(self.terminal)
        for name in ("completed", "failed", "queue_timeout", "cancelled"):
            assert sched.counters.total(name) == sum(1 for v in self.terminal.values() if v == name)
        assert sched.counters.total("enqueued") == len(self.admitted)
        assert sum(sched.depth(c) for c in CLASS_NAMES) == len(waiting)

    def finish(self):
        """Serve everything left: every admitted request must reach one terminal state."""
        self.sched.reconfigure(now_ms=self.now, backends=[backend("g1", slots=4)])
        for _ in range(10_000):
            for r in self.sched.running():
                self.sched.complete(r.id, now_ms=self.now, prompt_tokens=1, output_tokens=1)
                self.end(r.id, "completed")
            self.now += 50
            self.tick()
            if not self.sched.waiting() and not self.sched.running():
                break
        assert set(self.terminal) == self.admitted


def ran(harness, sequence, *, finish: bool = True):
    """``harness`` after every op of ``sequence`` (and, with ``finish``, its end-of-run checks)."""
    for op in sequence:
        harness.apply(op)
    if finish:
        harness.finish()
    return harness


def runs_agree(make, sequence, *, finish: bool = False, extra=lambda harness: None) -> None:
    """Two runs of ``sequence`` through fresh harnesses from ``make()`` log the same decisions and
    counters (and the same ``extra(harness)``)."""
    runs = [ran(make(), sequence, finish=finish) for _ in range(2)]
    first, second = ((h.log, h.sched.counters.as_dict(), extra(h)) for h in runs)
    assert first == second


def test_the_harness_runs_the_default_admission_unless_named():
    assert Harness().sched._config.queue.admission == "predicted"
    assert type(Harness().sched.admission).__name__ == "PredictedAdmission"
    assert type(Harness(admission="depth").sched.admission).__name__ == "DepthAdmission"


@FAST
@given(any_ops, st.booleans(), st.sampled_from([None, "depth"]))
def test_conservation_and_config_changes_never_lose_requests(sequence, depth, admission):
    ran(Harness(depth=depth, admission=admission), sequence)


@FAST
@given(
    any_ops, st.sampled_from(["fairgate", "fifo", "strict", "linear"]), st.booleans(), st.sampled_from([None, "depth"])
)
def test_determinism(sequence, policy, depth, admission):
    runs_agree(lambda: Harness(policy, depth, admission), sequence)


@FAST
@given(any_ops)
def test_determinism_of_the_default_byte_for_byte(sequence):
    """The default admission, enforced: two runs log the same decisions, compared as bytes."""
    runs = [ran(Harness(), sequence, finish=True) for _ in range(2)]
    first, second = (repr((h.log, h.sched.counters.as_dict(), h.terminal)).encode() for h in runs)
    assert first == second


@FAST
@given(overload_ops)
def test_after_a_round_with_plain_grants_nothing_waits_at_preempt(sequence):
    harness = Harness(depth=False)
    harness.sched.reconfigure(now_ms=0, backends=[backend("g1", slots=6)])  # any request fits any free slot
    harness.strict_preempt = True
    for op in sequence:
        harness.apply(op)


def run_to_end(sched, arrivals, service_ms):
    """Event-driven run: arrivals[(at_ms, request)], each running request holds its slot service_ms."""
    arrivals = sorted(arrivals, key=lambda x: (x[0], x[1].id))
    ends: dict[str, int] = {}
    grants = []
    now, i = 0, 0
    while i < len(arrivals) or sched.waiting() or ends:
        candidates = [
            t
            for t in (
                arrivals[i][0] if i < len(arrivals) else None,
                min(ends.values(), default=None),
                sched.next_wakeup_ms(now_ms=now),
            )
            if t is not None
        ]
        now = max(now, min(candidates))
        while i < len(arrivals) and arrivals[i][0] <= now:
            sched.submit(arrivals[i][1], now_ms=now)
            i += 1
        for rid in sorted(r for r, t in ends.items() if t <= now):
            sched.complete(rid, now_ms=now, prompt_tokens=1, output_tokens=1)
            del ends[rid]
        sched.expire(now_ms=now)
        for g in sched.dispatch(now_ms=now):
            ends[g.request.id] = now + service_ms
            grants.append(g)
    return grants


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 300),
    st.lists(st.integers(0, 20000), max_size=100),
    st.lists(st.sampled_from(TENANTS), min_size=1, max_size=300),
)
def test_no_starvation_within_capacity(batch_count, interactive_at, batch_tenants):
    # 4 slots x 100 ms: BATCH work <= 0.45 of capacity over its 20 s SLA, INTERACTIVE sparse
    every_request_within_sla(config(), batch_count, interactive_at, batch_tenants)


def every_request_within_sla(base, batch_count, interactive_at, batch_tenants) -> None:
    cfg = with_sla(base, "BATCH", 20000)
    sched = scheduler(cfg, slots=4, tenant_specs=tenants(("a", 0.6), ("b", 0.3), ("c", 0.1)))
    arrivals = [
        (0, req(f"b{k}", tenant=batch_tenants[k % len(batch_tenants)], cls="BATCH", at=0)) for k in range(batch_count)
    ]
    arrivals += [(t, req(f"i{k}", cls="INTERACTIVE", at=t)) for k, t in enumerate(interactive_at)]
    grants = run_to_end(sched, arrivals, 100)
    assert sched.counters.total("queue_timeout") == 0
    assert len(grants) == len(arrivals)
    for g in grants:
        assert g.waited_ms <= sched._class_spec(g.request.cls).sla_ms


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 300),
    st.lists(st.integers(0, 20000), max_size=100),
    st.lists(st.sampled_from(TENANTS), min_size=1, max_size=300),
)
def test_no_starvation_within_capacity_with_the_default_admission(batch_count, interactive_at, batch_tenants):
    # as above, with admission enforced by the default rule (its prior the true service time): the
    # load fits, so every request is admitted and starts within its SLA
    cfg = with_sla(config(enforce_depth=True, service_ms_prior=100), "BATCH", 20000)
    assert cfg.queue.admission == "predicted"
    sched = scheduler(cfg, slots=4, tenant_specs=tenants(("a", 0.6), ("b", 0.3), ("c", 0.1)))
    arrivals = [
        (0, req(f"b{k}", tenant=batch_tenants[k % len(batch_tenants)], cls="BATCH", at=0)) for k in range(batch_count)
    ]
    arrivals += [(t, req(f"i{k}", cls="INTERACTIVE", at=t)) for k, t in enumerate(interactive_at)]
    grants = run_to_end(sched, arrivals, 100)
    assert sched.counters.total("rejected_queue_full") == 0
    assert sched.counters.total("queue_timeout") == 0
    assert len(grants) == len(arrivals)
    for g in grants:
        assert g.waited_ms <= sched._class_spec(g.request.cls).sla_ms


@FAST
@given(
    st.lists(st.tuples(st.sampled_from(("a", "b", "c")), st.integers(1, 2000)), min_size=10, max_size=120),
    st.lists(st.floats(0.02, 1.0), min_size=3, max_size=3),
    st.integers(0, 30),
)
def test_fair_tokens_gap_between_backlogged_tenants(requests, shares, late_after):
    specs = [TenantSpec(t, s) for t, s in zip("abc", shares)]
    sched = scheduler(config(aging="none"), slots=1, tenant_specs=specs)
    weights = sched._tenant_weight
    late = [(t, c) for t, c in requests if t == "c"]
    early = [("c", 1)] + [(t, c) for t, c in requests if t != "c"]  # c is served once, then idles
    for k, (t, cost) in enumerate(early):
        sched.submit(req(f"e{k}", tenant=t, prompt=cost, out=0), now_ms=0)
    served = {t: 0.0 for t in "abc"}
    biggest = max(c / weights[t] for t, c in requests)
    step = 0

    def serve_one():
        (g,) = sched.dispatch(now_ms=step)
        r = g.request
        sched.complete(r.id, now_ms=step, prompt_tokens=r.prompt_tokens, output_tokens=0)
        return r

    for _ in range(min(late_after, len(early) - 2)):
        serve_one()
    for k, (t, cost) in enumerate(late):  # c arrives now: its counter is lifted
        sched.submit(req(f"l{k}", tenant=t, prompt=cost, out=0), now_ms=0)
    while True:
        backlogged = {t for t in "abc" if any(r.tenant == t for r in sched.waiting())}
        if len(backlogged) < 2:
            break
        r = serve_one()
        served[r.tenant] += r.prompt_tokens / weights[r.tenant]
        # tenants that stayed backlogged since c's arrival (service counted from there)
        still = [t for t in backlogged if any(x.tenant == t for x in sched.waiting())] or list(backlogged)
        for x in still:
            for y in still:
                assert served[x] - served[y] <= 2 * biggest + 1e-6


@FAST
@given(
    st.lists(
        st.tuples(
            st.sampled_from(CLASS_NAMES),
            st.integers(0, 8000),
            st.sampled_from(TENANTS),
            st.one_of(st.none(), st.integers(0, 3000)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_preempt_stage_serves_classes_earliest_deadline_first(entries):
    """While requests wait at preempt, each slot goes to the class of the earliest-deadline one,
    to that class's fair pick (a tenant's FIFO head); preempt grants stop once none is left."""
    harness = Harness(depth=False)
    sched = harness.sched
    sched.reconfigure(now_ms=0, backends=[backend("g1", slots=1)])
    now = 8000
    for k, (cls, at, tenant, extra) in enumerate(entries):
        deadline = None if extra is None else now + extra
        sched.submit(req(f"r{k}", tenant=tenant, cls=cls, at=at, deadline=deadline), now_ms=at)
    sched.expire(now_ms=now)
    while True:
        waiting = sched.waiting()
        due = [r for r in waiting if now - r.enqueued_ms >= 0.95 * sched._class_spec(r.cls).sla_ms]
        grants = sched.dispatch(now_ms=now)
        if not grants:
            break
        (g,) = grants
        assert g.preempt == bool(due)
        if due:
            assert g.request.cls == min(due, key=harness.edf_key).cls
        same_tenant = [r for r in waiting if r.cls == g.request.cls and r.tenant == g.request.tenant]
        order = lambda r: int(r.id[1:])  # noqa: E731  (submission order)
        assert order(g.request) == min(map(order, same_tenant))  # FIFO within a tenant
        sched.complete(g.request.id, now_ms=now, prompt_tokens=1, output_tokens=1)
