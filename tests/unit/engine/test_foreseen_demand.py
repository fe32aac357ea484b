"""Foreseen demand: the (class, tenant) time-of-day profile (``DemandProfile``) and predicted admission by it."""

from __future__ import annotations

import msgpack
import pytest

from scheduling.engine.forecast import DAY_MS, DemandProfile
from scheduling.engine.snapshot import from_record, to_record
from tests.unit.engine.engine_helpers import req, scheduler, tenants
from tests.unit.engine.test_prediction import predicting

MINUTE = 60_000
BUCKET = 5 * MINUTE


# --- the profile -------------------------------------------------------------------------------


def test_every_key_learns_when_the_engines_bucket_ends_and_the_partial_first_one_is_skipped():
    demand = DemandProfile(bucket_ms=BUCKET, alpha=0.5)
    demand.observe("BATCH", "a", 2 * MINUTE)  # the first bucket after a start: not learned
    for t in range(BUCKET, 2 * BUCKET, 1000):  # 300 of a in bucket 1
        demand.observe("BATCH", "a", t)
    demand.observe("BATCH", "b", 3 * BUCKET)  # b's first arrival, two buckets later
    assert not demand.covered[0] and demand.covered[1] and demand.covered[2]
    assert demand.profiles[("BATCH", "a")][1:3] == [300.0, 0.0]  # bucket 2 passed without a: 0
    assert demand.profiles[("BATCH", "")][1] == 300.0  # the class's total
    assert ("BATCH", "b") not in demand.profiles  # its bucket is still being counted
    assert demand.tenants == {"BATCH": ["a"]}
    for t in range(DAY_MS + BUCKET, DAY_MS + 2 * BUCKET, 2000):  # the next day: 150 in bucket 1
        demand.observe("BATCH", "a", t)
    demand.observe("BATCH", "a", DAY_MS + 2 * BUCKET)
    assert demand.profiles[("BATCH", "a")][1] == pytest.approx(225.0)  # 300 + 0.5 x (150 - 300)
    assert demand.profiles[("BATCH", "b")][3] == 1.0  # b's bucket of the day before, learned since
    assert demand.tenants == {"BATCH": ["a", "b"]}


def test_expected_spreads_each_bucket_over_it_and_covers_skips_the_current_bucket():
    demand = DemandProfile(bucket_ms=BUCKET, alpha=1.0)
    demand.observe("BATCH", "a", 0)
    for t in range(BUCKET, 2 * BUCKET, 1000):  # 300 in bucket 1, none in bucket 2
        demand.observe("BATCH", "a", t)
    demand.observe("BATCH", "a", 3 * BUCKET)
    assert demand.expected("BATCH", "a", BUCKET + BUCKET / 2, 3 * BUCKET) == pytest.approx(150.0)
    assert demand.expected("BATCH", "z", 0, DAY_MS) == 0.0  # no profile: none expected
    assert demand.covers(0.5 * BUCKET, 3 * BUCKET - 1)  # bucket 0 is the current one
    assert not demand.covers(0.5 * BUCKET, 3 * BUCKET)  # bucket 3 is being counted
    assert not demand.covers(DAY_MS - 1, DAY_MS + BUCKET)  # bucket 0 was never counted whole


def test_bucket_must_divide_a_day():
    with pytest.raises(ValueError):
        DemandProfile(bucket_ms=7 * MINUTE, alpha=0.5)


# --- admission by it ---------------------------------------------------------------------------


def engine_after_a_day_of_chat():
    """10 slots, 20 s prior; day 0: chat (INTERACTIVE) at 0.4/s for its first hour, then a request a
    day later closes the day's buckets. Chat at that rate for 30 minutes takes 720 x 20 s of the
    pool's 10 x 30 minutes: 180 BATCH requests of 20 s can start within their SLA."""
    sched = scheduler(predicting(), slots=10, tenant_specs=tenants(("a", 0.5), ("c", 0.5)))
    for k, t in enumerate(range(0, 60 * MINUTE, 2500)):
        sched.submit(req(f"i{k}", tenant="c", cls="INTERACTIVE", at=t), now_ms=t)
    sched.expire(now_ms=DAY_MS)
    sched.submit(req("day1", tenant="c", cls="RETRY", at=DAY_MS), now_ms=DAY_MS)
    return sched


def batch_admitted(sched, at_ms: int, count: int = 800) -> int:
    return sum(sched.submit(req(f"b{k}", at=at_ms), now_ms=at_ms).admitted for k in range(count))


def test_a_burst_is_admitted_for_what_the_previous_days_chat_leaves():
    sched = engine_after_a_day_of_chat()
    assert sched.demand is not None and sched.demand.covers(DAY_MS + BUCKET, DAY_MS + 35 * MINUTE)
    assert batch_admitted(sched, DAY_MS + BUCKET) == 180
    # without a learned day the assumption decides: 0.8 x 1 800 s x 10 / 20 s + 10 free - 5 fresh
    fresh = scheduler(predicting(), slots=10, tenant_specs=tenants(("a", 0.5), ("c", 0.5)))
    assert batch_admitted(fresh, DAY_MS + BUCKET) == 725


def test_the_other_tenants_foreseen_requests_count_up_to_their_share():
    sched = scheduler(predicting(), slots=10, tenant_specs=tenants(("a", 0.5), ("c", 0.5)))
    for k, t in enumerate(range(0, 60 * MINUTE, 2500)):  # c's BATCH at 0.4/s: 720 in 30 minutes
        sched.submit(req(f"c{k}", tenant="c", at=t), now_ms=t)
    sched.expire(now_ms=DAY_MS + 1)
    assert not sched.waiting()
    sched.submit(req("day1", tenant="c", cls="RETRY", at=DAY_MS + 1), now_ms=DAY_MS + 1)
    # 900 starts in 30 minutes; c's 720 foreseen count up to a's own count (equal weights): a's k-th
    # request fits while k + min(720, k) <= 900, so 450 of a's
    assert batch_admitted(sched, DAY_MS + BUCKET) == 450


def test_the_profile_survives_a_snapshot_and_the_restored_engine_admits_the_same():
    sched = engine_after_a_day_of_chat()
    copy = from_record(msgpack.unpackb(msgpack.packb(to_record(sched))))
    assert copy.demand is not None and sched.demand is not None
    assert copy.demand.as_record() == sched.demand.as_record()
    assert to_record(copy)["demand"] == to_record(sched)["demand"]
    assert batch_admitted(copy, DAY_MS + BUCKET) == batch_admitted(sched, DAY_MS + BUCKET) == 180


def test_the_depth_rule_learns_no_profile():
    sched = scheduler(predicting(admission="depth"), slots=10)
    sched.submit(req("x"), now_ms=0)
    assert sched.demand is None and to_record(sched)["demand"] is None


def test_a_span_inside_the_current_bucket_is_covered_only_when_that_bucket_was_learned():
    demand = DemandProfile(bucket_ms=BUCKET, alpha=0.5)
    demand.observe("BATCH", "a", 0)
    assert not demand.covers(1000, 2000)
    demand.observe("BATCH", "a", BUCKET)
    demand.observe("BATCH", "a", 2 * BUCKET)
    assert demand.covers(DAY_MS + BUCKET + 1000, DAY_MS + BUCKET + 2000)
