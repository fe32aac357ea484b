"""Property tests of predictive headroom: random operation sequences on a virtual clock.

After every dispatch step: a slot is left free while a lower class waits only because of holds,
and holds exist only while the forecast says the top class needs them (at most the need, each
ending within ``hold_ms``, none past its end); the top class never waits beside a free slot; and
the engine asks to be woken at the earliest hold's end. Determinism across presets, with headroom
configured, as for the rest of the engine.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine import TenantSpec, apply_policy
from scheduling.engine.headroom import turnover_bound
from scheduling.engine.headroom_spare import spare_slots
from scheduling.engine.model import HEADROOM_OFF, HeadroomPolicy
from scheduling.engine.store import WAITING
from tests.unit.engine.engine_helpers import backend, config, scheduler
from tests.unit.engine.test_properties import (
    FAST,
    TENANTS,
    Harness,
    every_request_within_sla,
    op_lists,
    ran,
    runs_agree,
    short_sla_config,
    submits,
)

POLICIES = ("fairgate", "fifo", "strict", "linear")
HEADROOM = replace(  # the section's pre-default keys with these values; the default: ``DefaultHarness``
    HEADROOM_OFF,
    enabled=True,
    horizon_ms=400,
    hold_ms=250,
    max_slots=2,
    min_expected=0.3,
    recent_ms=1000,
    bucket_ms=60_000,
)

top_heavy_submit = submits((1, 6), ["INTERACTIVE", "INTERACTIVE", "BATCH", "NEAR_RT", "RETRY"])
headroom_advance = st.tuples(st.just("advance"), st.integers(1, 400))
headroom_ops = op_lists(["fairgate", "strict", "off", "tight"], top_heavy_submit, headroom_advance, repeat=2)


def headroom_config(policy: str = "fairgate", headroom: HeadroomPolicy = HEADROOM):
    """Headroom configured, then the preset applied (which turns it off but for fairgate)."""
    return apply_policy(replace(short_sla_config(), headroom=headroom), policy)


class HeadroomHarness(Harness):
    """One backend of 4 slots without windows or reserved slots: any waiting request fits any free slot."""

    def __init__(self, policy: str = "fairgate") -> None:
        Harness.__init__(self, policy, depth=True)
        self.sched = scheduler(
            headroom_config(policy),
            backends=[backend("g1", slots=4)],
            tenant_specs=[TenantSpec("a", 0.6), TenantSpec("b", 0.3), TenantSpec("c", 0.1)],
        )
        self.policy = policy

    def op_reconfigure(self, variant):
        before = {r.id for r in self.sched.waiting()}
        if variant == "off":
            cfg = headroom_config(self.policy, HEADROOM_OFF)
        elif variant == "tight":
            cfg = headroom_config(self.policy, replace(HEADROOM, max_slots=1, min_expected=1.0))
        else:
            cfg = headroom_config(variant)
        self.sched.reconfigure(now_ms=self.now, config=cfg)
        assert {r.id for r in self.sched.waiting()} == before

    def tick(self):
        super().tick()
        self.check_holds()

    def check_holds(self):
        sched, now = self.sched, self.now
        holds = sched.headroom_holds()
        need = sched.headroom_need(now_ms=now)
        state = sched._capacity.states["g1"]
        free = max(0, state.slots - state.busy)
        waiting = [t for t in sched._store.tickets() if t.state == WAITING]
        lower = [t for t in waiting if not sched._plans[t.cls].privileged]
        top = [t for t in waiting if sched._plans[t.cls].privileged]
        assert len(holds) <= need  # held only while the forecast says the top class needs them
        if sched._config.policy.value != "fairgate":  # the other presets turn headroom off
            assert not holds and not need
        hold_ms = sched.headroom.policy.hold_ms
        assert all(now < end <= now + hold_ms for end in holds)  # none past its end, none longer than hold_ms
        if state.hold_until_ms > now:
            return  # an upstream 429 holds the whole backend: nothing is placed, for another reason
        if lower and free:
            assert free <= len(holds)  # a free slot left by a lower class: held, or it went in this step
        if top:
            assert not free  # the top class never waits beside a free slot
        if holds and waiting:
            assert sched.next_wakeup_ms(now_ms=now) <= holds[0]  # the driver looks again by the hold's end


def holds(harness) -> object:
    return harness.sched.headroom_holds()


@FAST
@given(headroom_ops)
def test_a_freed_slot_is_held_only_while_the_forecast_needs_it(sequence):
    ran(HeadroomHarness(), sequence)


@FAST
@given(headroom_ops, st.sampled_from(POLICIES))
def test_determinism_with_headroom_across_presets(sequence, policy):
    runs_agree(lambda: HeadroomHarness(policy), sequence, extra=holds)


class IdleHoldHarness(HeadroomHarness):
    """With ``hold_idle``: free slots that did not just free may be held too; the same invariants."""

    def __init__(self, policy: str = "fairgate") -> None:
        HeadroomHarness.__init__(self, policy)
        cfg = headroom_config(policy, replace(HEADROOM, hold_idle=True))
        self.sched.reconfigure(now_ms=0, config=cfg)


@FAST
@given(headroom_ops, st.sampled_from(POLICIES))
def test_with_hold_idle_holds_stay_within_the_need_and_the_run_is_deterministic(sequence, policy):
    runs_agree(
        lambda: IdleHoldHarness(policy), sequence, finish=True, extra=lambda harness: harness.sched.headroom_holds()
    )


class TurnoverHarness(IdleHoldHarness):
    """With ``miss_share`` (and ``hold_idle``): the need never exceeds what the pool's turnover asks,
    and the holds stay within it; the same invariants."""

    def __init__(self, policy: str = "fairgate") -> None:
        HeadroomHarness.__init__(self, policy)
        cfg = headroom_config(policy, replace(HEADROOM, hold_idle=True, max_slots=4, horizon_ms=2000, miss_share=0.5))
        self.sched.reconfigure(now_ms=0, config=cfg)

    def check_holds(self):
        super().check_holds()
        sched, now = self.sched, self.now
        forecast, policy = sched.headroom.forecast, sched.headroom.policy
        if forecast is None or not policy.miss_share:  # (a reconfigure may have set another headroom)
            return
        expected = forecast.expected(now, policy.horizon_ms, policy.profile_weight)
        if expected >= policy.min_expected:
            bound = turnover_bound(sched.free_rate(now) * policy.horizon_ms / expected, policy.miss_share)
            assert bound is None or sched.headroom_need(now_ms=now) <= bound


@FAST
@given(headroom_ops, st.sampled_from(POLICIES))
def test_with_miss_share_the_need_keeps_within_the_turnover_bound_and_the_run_is_deterministic(sequence, policy):
    runs_agree(lambda: TurnoverHarness(policy), sequence, finish=True, extra=holds)


class DefaultHarness(HeadroomHarness):
    """Headroom as a configuration without the section gets it (``HeadroomPolicy()``, on, bounded by
    the lower classes' deadlines), the horizon and holds scaled to the harness's short SLAs. After
    every step the need is within what the lower classes can spare; the same invariants otherwise,
    but the holds may exceed a need that a grant of the same round lowered (released next round)."""

    def __init__(self, policy: str = "fairgate") -> None:
        HeadroomHarness.__init__(self, policy)
        default = replace(HeadroomPolicy(), horizon_ms=400, hold_ms=1000, recent_ms=1000, bucket_ms=60_000)
        self.sched.reconfigure(now_ms=0, config=headroom_config(policy, default))
        self.default = default

    def op_reconfigure(self, variant):
        if variant == "fairgate":  # back to the default
            before = {r.id for r in self.sched.waiting()}
            self.sched.reconfigure(now_ms=self.now, config=headroom_config(self.policy, self.default))
            assert {r.id for r in self.sched.waiting()} == before
        else:
            super().op_reconfigure(variant)

    def check_holds(self):
        sched, now = self.sched, self.now
        policy = sched.headroom.policy
        need = sched.headroom_need(now_ms=now)
        if sched.headroom.on and policy.deadline_share:
            assert need <= spare_slots(sched, policy.deadline_share, now)
        holds = sched.headroom_holds()
        assert len(holds) <= policy.max_slots
        hold_ms = max(policy.hold_ms, self.default.hold_ms)  # a reconfiguration leaves the holds it finds
        assert all(now < end <= now + hold_ms for end in holds)
        state = sched._capacity.states["g1"]
        if state.hold_until_ms > now:
            return
        free = max(0, state.slots - state.busy)
        waiting = [t for t in sched._store.tickets() if t.state == WAITING]
        if any(not sched._plans[t.cls].privileged for t in waiting) and free:
            assert free <= len(holds)
        if any(sched._plans[t.cls].privileged for t in waiting):
            assert not free
        if holds and waiting:
            assert sched.next_wakeup_ms(now_ms=now) <= holds[0]


@FAST
@given(headroom_ops)
def test_the_default_conserves_requests_and_holds_no_more_than_the_lower_classes_spare(sequence):
    ran(DefaultHarness(), sequence)


@FAST
@given(headroom_ops, st.sampled_from(POLICIES))
def test_the_default_is_deterministic_across_presets(sequence, policy):
    runs_agree(lambda: DefaultHarness(policy), sequence, finish=True, extra=holds)


@FAST
@given(headroom_ops)
def test_the_default_is_deterministic_byte_for_byte(sequence):
    runs = [ran(DefaultHarness(), sequence, finish=True) for _ in range(2)]
    first, second = (repr((h.log, h.sched.counters.as_dict(), h.terminal, holds(h))).encode() for h in runs)
    assert first == second


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 300),
    st.lists(st.integers(0, 20000), max_size=100),
    st.lists(st.sampled_from(TENANTS), min_size=1, max_size=300),
)
def test_no_starvation_within_capacity_with_headroom_on_by_default(batch_count, interactive_at, batch_tenants):
    # test_properties' no-starvation case with the default headroom (its horizon, holds and rescue as
    # shipped): 4 slots x 100 ms, BATCH work <= 0.45 of capacity over its 20 s SLA, INTERACTIVE sparse
    every_request_within_sla(config(headroom=HeadroomPolicy()), batch_count, interactive_at, batch_tenants)
