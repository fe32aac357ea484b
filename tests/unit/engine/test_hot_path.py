"""The hot path's shortcuts (cached lane ranks, skipped preempt scans, per-tenant books, skipped
store writes) must answer exactly what a fresh computation answers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.engine import MemoryStore, Scheduler
from scheduling.engine.aging import AgingCurve
from scheduling.engine.model import AgingPolicy, AgingSegment, Boost
from scheduling.engine.store import WAITING
from tests.unit.engine.engine_helpers import REPORT_SEGMENTS, backend, config, req, tenants
from tests.unit.engine.test_properties import FAST, Harness, any_ops

CURVES = {
    "report": AgingCurve(AgingPolicy("piecewise", REPORT_SEGMENTS)),
    "linear": AgingCurve(AgingPolicy("linear")),
    "early": AgingCurve(
        AgingPolicy("piecewise", (AgingSegment(0.0, 0.3, Boost.NONE), AgingSegment(0.3, None, Boost.QUADRATIC, 0.7)))
    ),
}


@FAST
@given(st.sampled_from(sorted(CURVES)), st.integers(-(10**6), 10**9), st.integers(1, 10**8))
def test_no_boost_until_is_the_first_ms_with_a_possible_boost(name, enqueued_ms, sla_ms):
    curve = CURVES[name]
    until_ms = curve.no_boost_until_ms(enqueued_ms, sla_ms)
    before = (until_ms - 1 - enqueued_ms) / sla_ms
    assert before < curve.no_boost_below and curve.boost(before) == 0.0
    assert (until_ms - enqueued_ms) / sla_ms >= curve.no_boost_below


def test_no_aging_never_boosts():
    assert AgingCurve(AgingPolicy("none")).no_boost_until_ms(0, 1000) == math.inf


def test_linear_boost_is_the_ratio_and_never_negative():
    curve = CURVES["linear"]
    assert curve.boost(-0.5) == 0.0 and curve.boost(0.0) == 0.0 and curve.boost(0.4) == 0.4


def reference_rank(sched: Scheduler, lane, now_ms: int) -> tuple:
    """The rank of ``lane`` from scratch: its oldest waiting request not at preempt, by age key then id."""
    tickets = [t for t in sched._store.tickets() if t.state == WAITING and t.lane is lane and not t.promoted]
    if not tickets:
        return (float("inf"),)
    oldest = min(tickets, key=lambda t: (age_key_ms(sched, t), t.id))
    level = lane.level
    if sched._single_queue or not sched._aging_on:
        return (level, level, oldest.enqueued_ms, oldest.id)
    boost = sched._aging.boost((now_ms - oldest.enqueued_ms) / lane.sla_ms)
    return (level - boost, level, oldest.enqueued_ms, oldest.id)


def age_key_ms(sched: Scheduler, ticket) -> int:
    at_ms = sched._aging.preempt_at_ms(ticket.enqueued_ms, sched._class_spec(ticket.cls).sla_ms)
    return ticket.enqueued_ms if at_ms is None else at_ms


class CheckedHarness(Harness):
    """Also compares every shortcut with a fresh computation, before and after each dispatch."""

    def tick(self):
        self.check_shortcuts()
        super().tick()
        self.check_shortcuts()

    def check_shortcuts(self):
        sched, now = self.sched, self.now
        for lane in sched._lane_list:
            assert sched.order.rank(lane, now) == reference_rank(sched, lane, now), lane.key
        waiting = [t for t in sched._store.tickets() if t.state == WAITING]
        for (cls, tenant), book in sched._books.items():
            assert book.waiting == sum(1 for t in waiting if t.cls == cls and t.tenant == tenant), (cls, tenant)
        if sched._aging.preempt_ratio is not None:  # dispatch skips the preempt scan before _promote_due_ms
            due = [t for t in waiting if not t.promoted and age_key_ms(sched, t) < sched._promote_due_ms]
            assert not due


@FAST
@given(any_ops, st.booleans())
def test_shortcuts_agree_with_fresh_computation(sequence, depth):
    harness = CheckedHarness(depth=depth)
    for op in sequence:
        harness.apply(op)
    harness.finish()


@FAST
@given(any_ops, st.sampled_from(["strict", "linear", "fifo"]))
def test_shortcuts_agree_under_other_presets(sequence, policy):
    harness = CheckedHarness(policy=policy)
    for op in sequence:
        harness.apply(op)
    harness.finish()


class CopyingStore(MemoryStore):
    """A store that (like Redis) keeps copies, so it must be told about every change."""

    holds_live_tickets = False

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[str, int]] = []

    def ticket_put(self, ticket) -> None:
        self.puts.append((ticket.id, ticket.state))
        super().ticket_put(ticket)


def run_submit_dispatch_requeue(store: MemoryStore) -> None:
    sched = Scheduler(config(), tenants=tenants(("a", 1.0)), backends=[backend(slots=1)], store=store)
    sched.submit(req("r1"), now_ms=0)
    assert [g.request.id for g in sched.dispatch(now_ms=1)] == ["r1"]
    sched.requeue("r1", now_ms=2)
    assert sched.state_of("r1") == "queued"


def test_a_copying_store_receives_every_change():
    store = CopyingStore()
    run_submit_dispatch_requeue(store)
    assert store.puts == [("r1", 0), ("r1", 1), ("r1", 0)]  # admitted, running, back to waiting


def test_the_memory_store_is_only_written_for_new_tickets():
    class CountingMemoryStore(CopyingStore):
        holds_live_tickets = True

    store = CountingMemoryStore()
    run_submit_dispatch_requeue(store)
    assert store.puts == [("r1", 0)]


def test_grant_is_an_immutable_value():
    sched = Scheduler(config(), tenants=tenants(("a", 1.0)), backends=[backend(slots=1)])
    sched.submit(req("r1", at=5), now_ms=5)
    grant = sched.dispatch(now_ms=9)[0]
    assert (grant.request.id, grant.backend, grant.waited_ms, grant.preempt, grant.boosted) == (
        "r1",
        "gpu",
        4,
        False,
        False,
    )
    with pytest.raises(AttributeError):
        grant.backend = "other"
