"""The deadline rescue inside a class (``headroom.rescue_ms``, ``dispatching``).

Unit cases on a frozen virtual clock, then property tests over random operation sequences: with
the rescue on, no grant goes to a request of the same lane that is not at risk, or at risk with a
later deadline, while an at-risk request of that lane is left waiting (one uniform backend, so any
waiting request could have taken the slot); with it on but never reached, and with it off, the
decisions are those of the fair order; determinism across presets (which turn it off).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.engine import TenantSpec, apply_policy
from scheduling.engine.model import HeadroomPolicy
from scheduling.engine.schema import ConfigError, config_from_yaml, config_to_dict
from scheduling.engine.store import WAITING
from tests.unit.engine.engine_helpers import backend, config, req, scheduler, submit, with_sla
from tests.unit.engine.test_properties import FAST, Harness, any_ops, ran, runs_agree, short_sla_config

POLICIES = ("fairgate", "fifo", "strict", "linear")
RESCUE_MS = 200


def rescue_config(rescue_ms: int = RESCUE_MS, sla_ms: int = 600):
    cfg = with_sla(config(), "INTERACTIVE", sla_ms)
    return replace(cfg, headroom=HeadroomPolicy(rescue_ms=rescue_ms))


def two_tenants_one_slot(rescue_ms: int):
    """One slot. a's requests are large, b's small: at 250 b's counter is the lower, so the fair
    order serves b1 (t=150) before a2 (t=10, deadline 610, 360 ms left)."""
    sched = scheduler(rescue_config(rescue_ms), slots=1)
    big = {"cls": "INTERACTIVE", "prompt": 1000, "out": 1000}
    small = {"cls": "INTERACTIVE", "prompt": 10, "out": 10}
    submit(sched, req("a1", tenant="a", at=0, **big))
    assert [g.request.id for g in sched.dispatch(now_ms=0)] == ["a1"]
    submit(sched, req("b0", tenant="b", at=5, **small), req("a2", tenant="a", at=10, **big))
    submit(sched, req("b1", tenant="b", at=150, **small))
    sched.complete("a1", now_ms=200, prompt_tokens=1000, output_tokens=1000)
    assert [g.request.id for g in sched.dispatch(now_ms=200)] == ["b0"]
    sched.complete("b0", now_ms=250, prompt_tokens=10, output_tokens=10)
    return sched


def test_off_the_fair_order_serves_the_newer_request_of_the_other_tenant():
    sched = two_tenants_one_slot(0)
    assert [g.request.id for g in sched.dispatch(now_ms=250)] == ["b1"]
    assert sched.rescued == 0


def test_on_the_request_within_the_margin_goes_first_and_its_tenant_pays():
    sched = two_tenants_one_slot(400)
    counter_before = sched._lanes[("INTERACTIVE", "m")].tenants["a"].counter
    assert [g.request.id for g in sched.dispatch(now_ms=250)] == ["a2"]
    assert sched.rescued == 1
    assert sched._lanes[("INTERACTIVE", "m")].tenants["a"].counter > counter_before


def test_outside_the_margin_the_fair_order_stands():
    sched = two_tenants_one_slot(300)  # 360 ms left: not at risk yet
    assert [g.request.id for g in sched.dispatch(now_ms=250)] == ["b1"]


def test_among_those_at_risk_the_earliest_deadline_goes_first():
    sched = scheduler(rescue_config(400), slots=1)
    submit(sched, req("x", tenant="a", cls="INTERACTIVE", at=0))
    sched.dispatch(now_ms=0)
    submit(
        sched,
        req("a2", tenant="a", cls="INTERACTIVE", at=100),
        req("b1", tenant="b", cls="INTERACTIVE", at=50),
        req("b2", tenant="b", cls="INTERACTIVE", at=60, deadline=420),  # the client's deadline is earlier
    )
    sched.complete("x", now_ms=300, prompt_tokens=100, output_tokens=100)
    assert [g.request.id for g in sched.dispatch(now_ms=300)] == ["b2"]


def test_rescue_ms_is_in_the_yaml_checked_and_off_in_the_presets():
    yaml = "scheduler:\n  classes:\n    - {name: INTERACTIVE, level: 0, sla_ms: 3000, price_factor: 1.6}\n"
    cfg = config_from_yaml(yaml + "  headroom: {rescue_ms: 1000}\n")
    assert cfg.headroom.rescue_ms == 1000 and config_to_dict(cfg)["headroom"]["rescue_ms"] == 1000
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(yaml + "  headroom: {rescue_ms: -1}\n")
    assert any(issue.field == "scheduler.headroom.rescue_ms" for issue in caught.value.issues)
    for policy in ("fifo", "strict", "linear"):
        assert apply_policy(cfg, policy).headroom.rescue_ms == 0


# --- properties ------------------------------------------------------------------------------


class RescueHarness(Harness):
    """One backend of 4 slots without windows or reserved slots: any waiting request fits any free slot."""

    def __init__(self, policy: str = "fairgate", rescue_ms: int = RESCUE_MS, long_slas: bool = False) -> None:
        Harness.__init__(self, policy, depth=True)
        self.rescue_ms, self.long_slas = rescue_ms, long_slas
        self.sched = scheduler(
            self.config(policy),
            backends=[backend("g1", slots=4)],
            tenant_specs=[TenantSpec("a", 0.6), TenantSpec("b", 0.3), TenantSpec("c", 0.1)],
        )
        self.policy = policy

    def op_submit(self, count, tenant, cls, prompt, out, timeout):
        Harness.op_submit(self, count, tenant, cls, prompt, out, None if self.long_slas else timeout)

    def config(self, policy: str):
        """The rescue configured, then the preset applied (which turns it off but for fairgate)."""
        cfg = short_sla_config(depth=True)
        if self.long_slas:  # no deadline comes within the margin in a run (no client deadlines either)
            for cls in ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY"):
                cfg = with_sla(cfg, cls, 100_000_000)
        return apply_policy(replace(cfg, headroom=HeadroomPolicy(rescue_ms=self.rescue_ms)), policy)

    def op_reconfigure(self, variant):
        before = {r.id for r in self.sched.waiting()}
        self.sched.reconfigure(now_ms=self.now, config=self.config(variant if variant in POLICIES else self.policy))
        assert {r.id for r in self.sched.waiting()} == before

    def tick(self):
        granted_before = len([e for e in self.log if e[0] == "grant"])
        super().tick()
        grants = [e[1] for e in self.log if e[0] == "grant"][granted_before:]
        self.check_rescue(grants)

    def check_rescue(self, granted: list[str]) -> None:
        sched, now = self.sched, self.now
        margin = sched._rescue_ms
        if sched._config.policy.value != "fairgate":  # the other presets turn the rescue off
            assert not margin
        if not margin or not granted or sched._capacity.states["g1"].hold_until_ms > now:
            return
        tickets = {t.id: t for t in sched._store.tickets()}
        at_risk: dict[str, list[tuple[int, int, str]]] = {}  # by class: waiting, within the margin
        for t in tickets.values():
            if t.state == WAITING and t.deadline_ms is not None and t.deadline_ms - now <= margin:
                at_risk.setdefault(t.cls, []).append((t.deadline_ms, t.enqueued_ms, t.id))
        for rid in granted:
            g = tickets.get(rid)
            if g is None or g.cls not in at_risk:
                continue
            mine = (g.deadline_ms, g.enqueued_ms, g.id) if g.deadline_ms is not None else None
            first_left = min(at_risk[g.cls])
            # the slot went to a request of the same class while an at-risk one waits: only to one at
            # risk with an earlier deadline
            assert mine is not None and mine[0] - now <= margin and mine < first_left, (rid, first_left)


@FAST
@given(any_ops)
def test_with_the_rescue_no_slot_goes_past_a_request_at_risk_of_its_class(sequence):
    ran(RescueHarness(), sequence)


@FAST
@given(any_ops)
def test_a_rescue_never_reached_changes_no_decision(sequence):
    on, off = (ran(RescueHarness(rescue_ms=m, long_slas=True), sequence) for m in (1, 0))
    assert on.sched.rescued == 0
    assert on.log == off.log and on.sched.counters.as_dict() == off.sched.counters.as_dict()


@FAST
@given(any_ops)
def test_until_the_first_rescue_the_decisions_are_the_fair_orders(sequence):
    on, off = RescueHarness(), RescueHarness(rescue_ms=0)
    for op in sequence:
        on.apply(op)
        off.apply(op)
        if on.sched.rescued:
            break
        assert on.log == off.log


@FAST
@given(any_ops, st.sampled_from(POLICIES))
def test_determinism_with_the_rescue_across_presets(sequence, policy):
    runs_agree(lambda: RescueHarness(policy), sequence, finish=True, extra=lambda harness: harness.sched.rescued)
