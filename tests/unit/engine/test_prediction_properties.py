"""Property tests of prediction: random operation sequences on a virtual clock (see test_properties)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from scheduling.engine import FairnessMode, apply_policy
from scheduling.engine.admission import turnovers_at_least
from scheduling.engine.prediction import MISS_RISK
from scheduling.engine.store import WAITING
from tests.unit.engine.engine_helpers import config, with_sla
from tests.unit.engine.test_hot_path import CheckedHarness
from tests.unit.engine.test_properties import FAST, Harness, any_ops, complete_op, ran, runs_agree, submit_op, submits

POLICIES = ("fairgate", "fifo", "strict", "linear")
SHORT = {"INTERACTIVE": 600, "NEAR_RT": 1500, "BATCH": 4000, "RETRY": 8000}  # test_properties' SLAs
MIN_MS = 60_000
LONG = {"INTERACTIVE": 5000, "NEAR_RT": 20000, "BATCH": 120_000, "RETRY": 240_000}  # backlogs past a window

# Long horizons: requests hold a slot 0.5-30 s (``LongPredictHarness``) and the clock moves up to
# 20 s at a time, so classes stay backlogged for more than the 60 s window: measured drains and
# early fast-fail are exercised, not only the assumption.
long_submit_op = submits((5, 40), ["BATCH", "BATCH", "RETRY", "NEAR_RT", "INTERACTIVE"], (5000, 200_000))
long_ops = st.lists(
    st.one_of(
        submit_op,
        long_submit_op,
        long_submit_op,
        st.tuples(st.just("advance"), st.integers(1000, 20_000)),
        st.tuples(st.just("advance"), st.integers(1000, 20_000)),
        st.tuples(st.just("advance"), st.integers(1000, 20_000)),
        complete_op,
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("requeue"), st.integers(0, 50), st.integers(0, 400)),
        st.tuples(st.just("reconfigure"), st.sampled_from(["fairgate", "strict", "wrr", "sla"])),
    ),
    min_size=60,
    max_size=120,
)


def predicted_config(
    policy: str = "fairgate",
    *,
    fairness=FairnessMode.WEIGHTED_FAIR_TOKENS,
    slas=SHORT,
    batch_sla=None,
    prior=200,
    knobs: dict | None = None,
):
    """A configuration with prediction on (``knobs``: more of the queue section), then the preset applied."""
    cfg = config(fairness=fairness, enforce_depth=True, service_ms_prior=prior)
    for name, sla in slas.items():
        cfg = with_sla(cfg, name, batch_sla if name == "BATCH" and batch_sla else sla)
    queue = replace(cfg.queue, admission="predicted", fast_fail=True, predict_margin=0.8, **(knobs or {}))
    cfg = replace(cfg, queue=queue)
    return apply_policy(cfg, policy)


class Predicting:
    """Harness mix-in: prediction on, kept across reconfigurations; after every admission the
    engine's own model must say the request can start in time and is not hopeless."""

    slas = SHORT
    prior = 200
    knobs: dict = {}

    def setup(self, policy: str) -> None:
        self.sched.reconfigure(now_ms=0, config=self.config(policy))

    def config(self, policy: str = "fairgate", **kw):
        return predicted_config(policy, slas=self.slas, prior=self.prior, knobs=self.knobs, **kw)

    def op_reconfigure(self, variant):
        before = {r.id for r in self.sched.waiting()}
        if variant == "wrr":
            cfg = self.config(fairness=FairnessMode.WEIGHTED_ROUND_ROBIN)
        elif variant == "sla":
            cfg = self.config(batch_sla=self.slas["BATCH"] * 5 // 8)
        else:
            cfg = self.config(variant)
        self.sched.reconfigure(now_ms=self.now, config=cfg)
        assert {r.id for r in self.sched.waiting()} == before

    def op_submit(self, count, tenant, cls, prompt, out, timeout):
        sched = self.sched
        for _ in range(count):
            first = self.next_id
            wait_ms = sched.predicted_wait_ms(cls, tenant, now_ms=self.now)
            super().op_submit(1, tenant, cls, prompt, out, timeout)
            rid = f"r{first}"
            if rid in self.admitted and sched._predicted:
                self.check_admitted(rid, wait_ms)

    def check_admitted(self, rid: str, wait_ms: float) -> None:
        sched, now = self.sched, self.now
        ticket = sched._store.ticket_get(rid)
        assert ticket is not None and ticket.state == WAITING
        assert wait_ms <= ticket.deadline_ms - now, (rid, wait_ms, ticket.deadline_ms - now)
        plan = sched._plans[ticket.cls]
        usable = sched.prediction._usable_slots(plan)
        drain = sched.prediction._drain(plan, usable, now)
        higher, free = sched.prediction._higher_waiting(plan), sched.prediction._free_now(usable)
        assert not sched.prediction._hopeless(ticket, plan, higher, free, drain, now), rid
        left = ticket.deadline_ms - now
        must = higher + sched.prediction._ahead(ticket.cls, ticket.tenant, 0) - free
        after = sched.prediction.evidence.after_ms(ticket.cls, drain.measured, left)
        short = left < sched.prediction._service_now(ticket.cls)
        if must > 0 and (short or left <= after):  # a short horizon (or within margin_after_ms): a chance
            need = math.ceil(must + sched.prediction._fresh_deficit(ticket.cls, free, left, now))
            mean = sched._cls_service.get(ticket.cls)
            own = after and mean is not None and not short
            dispersion = mean.dispersion() if own else 1.0  # its own slots' renewal count, else Poisson
            assert turnovers_at_least(need, drain.rate_per_ms * left, dispersion) >= 1 - MISS_RISK, rid

    def tick(self):
        super().tick()
        for lane in self.sched._lane_list:  # the lazy marks, read from both ends, stay counted
            for tq in lane.tenants.values():
                dead = sum(
                    1
                    for i, t in enumerate(tq.items)
                    if not (t.state == WAITING and t.tq is tq and t.tq_no == tq.head_no + i)
                )
                assert dead == tq.dead and len(tq.items) - dead == tq.live


class PredictHarness(Predicting, Harness):
    def __init__(self, policy: str = "fairgate") -> None:
        Harness.__init__(self, policy, depth=True)
        self.setup(policy)


class LongPredictHarness(PredictHarness):
    """Long SLAs and service of ``prompt x 10`` ms (0.5-30 s) instead of ``prompt / 10``."""

    slas = LONG
    prior = 5000

    def service_ms(self, rid: str) -> int:
        return next(r for r in self.sched.running() if r.id == rid).prompt_tokens * 10

    def op_advance(self, dt):
        target = self.now + dt
        while True:
            ends = {r.id: self.started[r.id] + r.prompt_tokens * 10 for r in self.sched.running()}
            wake = self.sched.next_wakeup_ms(now_ms=self.now)
            stops = [t for t in ends.values() if t <= target]
            if wake is not None and wake <= target:
                stops.append(wake)
            if not stops:
                break
            self.now = max(self.now, min(stops))
            for rid, end in sorted(ends.items()):
                if end <= self.now:
                    prompt = next(r.prompt_tokens for r in self.sched.running() if r.id == rid)
                    self.sched.complete(rid, now_ms=self.now, prompt_tokens=prompt, output_tokens=1)
                    self.end(rid, "completed")
            self.tick()
        self.now = target


class KnobbedPredictHarness(PredictHarness):
    """With ``prior_weight`` (a class never served is planned on the prior over the margin, then on its
    censored mean) and ``margin_after_ms`` (no margin on the first 2 s of a horizon)."""

    knobs = {"prior_weight": 8, "margin_after_ms": 2000}


class KnobbedLongPredictHarness(LongPredictHarness):
    knobs = {"prior_weight": 8, "margin_after_ms": MIN_MS}


class CheckedPredictHarness(Predicting, CheckedHarness):
    def __init__(self, policy: str = "fairgate") -> None:
        CheckedHarness.__init__(self, policy, depth=True)
        self.setup(policy)


@FAST
@given(any_ops, st.sampled_from(POLICIES))
def test_prediction_admits_only_what_its_model_can_start_in_time_and_loses_nothing(sequence, policy):
    ran(PredictHarness(policy), sequence)


@FAST
@given(any_ops, st.sampled_from(POLICIES))
def test_determinism_with_prediction_across_presets(sequence, policy):
    runs_agree(lambda: PredictHarness(policy), sequence)


@FAST
@given(any_ops)
def test_shortcuts_agree_with_fresh_computation_with_prediction(sequence):
    ran(CheckedPredictHarness(), sequence)


@FAST
@given(any_ops)
def test_fast_fail_only_ends_waiting_requests_before_their_deadline(sequence):
    harness = ran(PredictHarness(), sequence, finish=False)
    early = [entry for entry in harness.log if entry[0] == "queue_timeout"]
    tally = harness.sched.counters.total("fast_failed")
    assert tally <= len(early) == harness.sched.counters.total("queue_timeout")


@FAST
@given(long_ops)
def test_over_long_backlogs_admission_and_fast_fail_agree_and_lose_nothing(sequence):
    ran(LongPredictHarness(), sequence)


@FAST
@given(long_ops, st.sampled_from(POLICIES))
def test_determinism_over_long_backlogs_across_presets(sequence, policy):
    runs_agree(lambda: LongPredictHarness(policy), sequence)


@FAST
@given(any_ops, st.sampled_from(POLICIES))
def test_with_prior_weight_and_margin_after_admission_keeps_to_its_model_and_loses_nothing(sequence, policy):
    ran(KnobbedPredictHarness(policy), sequence)


@FAST
@given(long_ops, st.sampled_from(POLICIES))
def test_with_prior_weight_and_margin_after_over_long_backlogs_deterministic_and_lossless(sequence, policy):
    runs_agree(lambda: KnobbedLongPredictHarness(policy), sequence, finish=True)
