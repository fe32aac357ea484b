"""The embedded dispatcher's demand profile in the database (gateway.demand_store): learned, closed,
and there again in the next dispatcher; a stored profile of other settings ignored; a process that
died without closing keeps what its last periodic write stored; the shared scheduler's lease holder
writes the row too. Real database (SQLite by default,
PostgreSQL with DATABASE_URL); the engine's clock is the event loop's, so each check turns the
profile by the buckets between the two dispatchers' clocks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync

from gateway.demand_store import DEMAND, DemandStore
from gateway.dispatcher import Dispatcher
from gateway.shared import SharedDispatcher
from scheduling.config_files import config_load_file
from scheduling.engine.forecast import DAY_MS, DemandProfile
from scheduling.learned import learned_profile_get, learned_profile_save
from scheduling.selectors import config_live
from scheduling.shared.replica import engine_of

pytestmark = pytest.mark.django_db(transaction=True)
EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "scheduler.example.yaml"
BUCKET = 300_000  # the example's headroom.bucket_ms (the default)


@pytest.fixture(autouse=True)
def example_config():
    config_load_file(EXAMPLE, actor="fixture")


def learn_hours(d: Dispatcher, *, hours: int, per_bucket: int = 3) -> DemandProfile:
    """``hours`` of arrivals before the engine's now, ``per_bucket`` of support and one of sales per
    bucket in BATCH, the last bucket still being counted."""
    demand = d.sched.demand
    assert demand is not None and demand.compatible(bucket_ms=BUCKET, alpha=0.5)
    start_ms = (d.now_ms() // BUCKET - hours * 12) * BUCKET
    for bucket in range(hours * 12 + 1):
        for i in range(per_bucket):
            demand.observe("BATCH", "support", start_ms + bucket * BUCKET + i)
        demand.observe("BATCH", "sales", start_ms + bucket * BUCKET + per_bucket)
    return demand


def moved(demand: DemandProfile, first: Dispatcher, second: Dispatcher) -> dict:
    """``demand`` (of ``first``'s engine) as ``second``'s engine should read it: at rest, on its clock."""
    shift = first.demand_store.wall_buckets(BUCKET) - second.demand_store.wall_buckets(BUCKET)
    return demand.turned(shift).as_record()


def test_a_learned_profile_outlives_the_dispatcher():
    async def scenario():
        first = await Dispatcher.create()
        assert not first.sched.demand.profiles  # nothing stored yet: a cold start
        learned = learn_hours(first, hours=2)
        assert learned.profiles[("BATCH", "support")].count(3.0) == 23  # the first bucket and the last not learned
        await first.close()
        second = await Dispatcher.create()
        try:
            restored = second.sched.demand
            assert restored is not learned and restored.as_record() == moved(learned, first, second)
            assert restored.tenants == {"BATCH": ["support", "sales"]}
            assert restored.bucket is None and not restored.counts  # the restart's first bucket is partial
        finally:
            await second.close()

    async_to_sync(scenario)()


def test_the_row_holds_the_profile_on_the_wall_clocks_buckets():
    demand = DemandProfile(bucket_ms=BUCKET, alpha=0.5)
    for t in range(0, 3 * BUCKET, BUCKET):  # engine buckets 0, 1, 2: bucket 1 learns one arrival
        demand.observe("BATCH", "support", t)
    assert demand.profiles[("BATCH", "support")][:3] == [None, 1.0, None]  # bucket 2 is being counted
    engine = SimpleNamespace(demand=demand)
    ahead = DemandStore(wall_offset_ms=DAY_MS + 4 * BUCKET + BUCKET // 3)  # the wall clock 4.33 buckets ahead
    async_to_sync(ahead.save)(engine)
    stored = learned_profile_get(name=DEMAND)
    assert stored["profiles"][0] == ["BATCH", "support", [None] * 5 + [1.0] + [None] * 282]
    assert [i for i, whole in enumerate(stored["covered"]) if whole] == [5]
    assert stored["bucket"] is None and stored["counts"] == []  # at rest

    engine.demand = DemandProfile(bucket_ms=BUCKET, alpha=0.5)
    behind = DemandStore(wall_offset_ms=-BUCKET)  # a clock one bucket behind the wall's
    assert async_to_sync(behind.load)(engine)
    assert engine.demand.profiles[("BATCH", "support")][5:8] == [None, 1.0, None]
    assert engine.demand.covers(5.5 * BUCKET, 7 * BUCKET - 1) and not engine.demand.covers(5.5 * BUCKET, 7 * BUCKET)


@pytest.mark.parametrize(
    "change",
    [{"bucket_ms": 600_000}, {"alpha": 0.25}, {"profiles": "not a list"}],
    ids=["bucket", "alpha", "unreadable"],
)
def test_a_stored_profile_of_other_settings_is_ignored(change):
    stored = DemandProfile(bucket_ms=BUCKET, alpha=0.5)
    stored.add_key(("BATCH", "support"))[:] = [7.0] * (DAY_MS // BUCKET)
    learned_profile_save(name=DEMAND, record={**stored.as_record(), **change})

    async def scenario():
        d = await Dispatcher.create()
        try:
            demand = d.sched.demand
            assert demand is not None and demand.compatible(bucket_ms=BUCKET, alpha=0.5)
            assert not demand.profiles and not any(demand.covered)
        finally:
            await d.close()

    async_to_sync(scenario)()
    assert learned_profile_get(name=DEMAND) == {**stored.as_record(), **change}  # nothing learned: not replaced


def test_a_dispatcher_that_died_keeps_what_its_last_periodic_write_stored():
    async def scenario():
        first = await Dispatcher.create()
        learned = learn_hours(first, hours=1)
        first.keep_demand()  # the configuration poll's tick: a bucket was learned since the last write
        writing = first.demand_store.writing
        assert writing is not None
        await writing
        first.keep_demand()  # no bucket learned since: no new write
        assert first.demand_store.writing is writing
        written = learned.turned(0)
        learned.observe("BATCH", "support", (learned.bucket + 1) * BUCKET)  # one more bucket, never written
        assert learned.turned(0).as_record() != written.as_record()
        first.core.poller.cancel()  # the process dies: no close, no poll
        await asyncio.gather(first.core.poller, return_exceptions=True)
        second = await Dispatcher.create()
        try:
            assert second.sched.demand.as_record() == moved(written, first, second)
        finally:
            await second.close()

    async_to_sync(scenario)()


@pytest.mark.redis
def test_the_shared_lease_holder_writes_the_profile_on_the_wall_clock(settings):
    settings.FAIRGATE_SHARED_PREFIX = f"{settings.FAIRGATE_SHARED_PREFIX}:demand"
    config = config_live()

    async def run() -> None:
        d = SharedDispatcher(config, audit_pk=None, loop=asyncio.get_running_loop())
        try:
            d.owner.sched = engine = engine_of(config)  # as if replayed from the dispatcher's steps
            demand = engine.demand
            for t in range(0, 3 * BUCKET, BUCKET):
                demand.observe("BATCH", "support", t)
            d.keep_demand()  # a standby: not its to write
            assert d.demand_store.writing is None
            d.owner.token = "1:this"  # holds the lease
            d.keep_demand()
            await d.demand_store.writing
        finally:
            await d.redis.aclose()
        return demand.turned(0).as_record()

    written = asyncio.run(run())
    assert learned_profile_get(name=DEMAND) == written
    assert written["profiles"][0][2][:3] == [None, 1.0, None]  # the wall clock's buckets: no turn
