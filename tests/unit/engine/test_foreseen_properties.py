"""Property tests of foreseen demand: random operations on day 0, then on day 1 at the same time of
day, where the learned profile decides admission (test_properties' harness and checks, two days long).

An arrival 1 ms before the profile's second bucket starts its counting and day 0's ops run from
that bucket on, so it is counted whole and the jump to day 1 learns it (and 0 for the buckets
passed). Reconfigurations stay Fairgate's (the other presets switch prediction off). Each run
asserts that the foreseen path decided some day-1 admissions, so no property holds vacuously.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine import FairnessMode, prediction
from scheduling.engine.forecast import DAY_MS
from scheduling.engine.snapshot import to_record
from tests.unit.engine.engine_helpers import config, req, scheduler, tenants, with_sla
from tests.unit.engine.test_properties import (
    FAST,
    TENANTS,
    Harness,
    op_lists,
    overload_ops,
    ran,
    run_to_end,
    runs_agree,
    short_sla_config,
)
from tests.unit.engine.test_snapshot import packed, queue_view, restored

BUCKET = 300_000  # headroom's default bucket_ms, the profile's
day_ops = st.one_of(  # test_properties' ops, reconfiguring only to what keeps prediction (Fairgate's)
    op_lists(["fairgate", "wrr", "sla", "fifo_lanes"]), overload_ops
)
DAY1 = [("next_day",), ("submit", 12, "a", "RETRY", 400, 1, None)]  # past the free slots, 8 s to go


@contextlib.contextmanager
def foreseen_decisions() -> Iterator[list[tuple[int, object]]]:
    """``(now_ms, result)`` of every ``foreseen_refusal`` call while inside."""
    calls: list[tuple[int, object]] = []
    real = prediction.foreseen_refusal

    def counted(*args, **kw):
        result = real(*args, **kw)
        calls.append((args[-1], result))
        return result

    prediction.foreseen_refusal = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        prediction.foreseen_refusal = real


def decided_on_day_1(calls: list[tuple[int, object]]) -> int:
    return sum(1 for now, result in calls if now >= DAY_MS and result is not None)


class DayHarness(Harness):
    """``Harness`` from ``BUCKET - 1`` with one arrival there; ``next_day`` advances to the same time
    of day a day later."""

    def __init__(self) -> None:
        super().__init__()
        self.now = BUCKET - 1
        self.apply(("submit", 1, "b", "RETRY", 50, 1, None))
        self.apply(("advance", 1))
        self.start = self.now

    def op_reconfigure(self, variant):
        if variant != "fifo_lanes":
            return super().op_reconfigure(variant)
        before = {r.id for r in self.sched.waiting()}
        self.sched.reconfigure(now_ms=self.now, config=short_sla_config(fairness=FairnessMode.FIFO))
        assert {r.id for r in self.sched.waiting()} == before

    def op_next_day(self) -> None:
        self.op_advance(self.start + DAY_MS - self.now)


def two_days(day0: list, day1: list) -> list:
    return day0 + DAY1 + day1


@FAST
@given(day_ops, day_ops)
def test_day_1_by_foreseen_demand_loses_nothing_and_keeps_the_harness_checks(day0, day1):
    with foreseen_decisions() as calls:
        harness = ran(DayHarness(), two_days(day0, day1))
    assert decided_on_day_1(calls) > 0
    assert harness.sched.demand is not None and harness.sched.demand.covers(harness.start + DAY_MS, DAY_MS + 2 * BUCKET)


@FAST
@given(day_ops, day_ops)
def test_day_1_by_foreseen_demand_is_deterministic_byte_for_byte(day0, day1):
    with foreseen_decisions() as calls:
        runs_agree(
            DayHarness,
            two_days(day0, day1),
            finish=True,
            extra=lambda h: (repr((h.log, h.terminal)).encode(), msgpack.packb(to_record(h.sched))),
        )
    assert decided_on_day_1(calls) > 0


@FAST
@given(day_ops, day_ops, st.lists(st.integers(0, 120), min_size=1, max_size=3))
def test_a_snapshot_mid_day_1_continues_identically(day0, day1, cuts):
    sequence, cuts = two_days(day0, day1), {len(day0) + 1 + cut % (len(day1) + 1) for cut in cuts}
    original = DayHarness()
    copies: list[Harness] = []
    with foreseen_decisions() as calls:
        for at, op in enumerate(sequence):
            if at in cuts:  # from just after the day's jump on
                copies.append(restored(original))
                assert packed(to_record(copies[-1].sched)) == packed(to_record(original.sched))
            original.apply(op)
            for harness in copies:
                harness.apply(op)
    assert copies and decided_on_day_1(calls) > 0
    for harness in copies:
        assert harness.log == original.log
        assert queue_view(harness) == queue_view(original)
        assert msgpack.packb(to_record(harness.sched)) == msgpack.packb(to_record(original.sched))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 300),
    st.lists(st.integers(0, 20000), max_size=100),
    st.lists(st.sampled_from(TENANTS), min_size=1, max_size=300),
    st.integers(10, 300),
    st.lists(st.integers(0, 20000), max_size=100),
)
def test_no_starvation_within_capacity_on_day_1(batch_count, interactive_at, batch_tenants, count0, interactive0):
    """test_properties' load within capacity with the default admission, on both days: day 1's
    requests, admitted by the profile, are all admitted and start within their SLA."""
    cfg = with_sla(config(enforce_depth=True, service_ms_prior=100), "BATCH", 20000)
    sched = scheduler(cfg, slots=4, tenant_specs=tenants(("a", 0.6), ("b", 0.3), ("c", 0.1)))

    def day(start: int, tag: str, count: int, interactive: list[int]) -> list:
        at = [(start, req(f"{tag}b{k}", tenant=batch_tenants[k % len(batch_tenants)], at=start)) for k in range(count)]
        return at + [(start + t, req(f"{tag}i{k}", cls="INTERACTIVE", at=start + t)) for k, t in enumerate(interactive)]

    arrivals = [(BUCKET - 1, req("first", cls="RETRY", at=BUCKET - 1))]
    arrivals += day(BUCKET, "d0", count0, interactive0) + day(DAY_MS + BUCKET, "d1", batch_count, interactive_at)
    with foreseen_decisions() as calls:
        grants = run_to_end(sched, arrivals, 100)
    assert decided_on_day_1(calls) > 0
    assert sched.counters.total("rejected_queue_full") == 0
    assert sched.counters.total("queue_timeout") == 0
    assert len(grants) == len(arrivals)
    for g in grants:
        assert g.waited_ms <= sched._class_spec(g.request.cls).sla_ms
