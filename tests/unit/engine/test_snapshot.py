"""The engine's snapshot is a plain record: an engine restored from one decides as the original does.

Random operation sequences (test_properties' harnesses: plain, headroom, prediction with its knobs,
deadline rescue) run on one engine; at random points it is recorded, packed with msgpack, and
restored into a fresh engine that then takes the same operations: every decision, the counters,
the queue view and the final record are the same. A record of another version is refused.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import replace
from decimal import Decimal

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.engine import BackendSpec, TenantSpec
from scheduling.engine.circuits import Circuits
from scheduling.engine.config_record import config_from_record, config_to_record
from scheduling.engine.model import Dialect, DowngradeRule, HeadroomPolicy
from scheduling.engine.snapshot import SNAPSHOT_VERSION, SnapshotVersionError, from_record, to_record
from scheduling.shared.protocol import Routes
from scheduling.shared.state import pack_config, pack_state, unpack_config, unpack_state
from tests.unit.engine.engine_helpers import req, scheduler, submit
from tests.unit.engine.test_headroom_properties import HeadroomHarness, headroom_ops
from tests.unit.engine.test_prediction_properties import KnobbedPredictHarness
from tests.unit.engine.test_properties import FAST, Harness, any_ops, short_sla_config
from tests.unit.engine.test_rescue import RescueHarness

HARNESSES = {
    "plain": Harness,
    "headroom": HeadroomHarness,
    "prediction": KnobbedPredictHarness,
    "rescue": RescueHarness,
}


def packed(record: dict) -> dict:
    return msgpack.unpackb(msgpack.packb(record))


def restored(harness: Harness) -> Harness:
    """A copy of ``harness`` whose engine is rebuilt from the original's packed record."""
    engine = from_record(packed(to_record(harness.sched)))
    return copy.deepcopy(harness, {id(harness.sched): engine})


def queue_view(harness: Harness) -> tuple:
    sched, now = harness.sched, harness.now
    waiting = sched.waiting()
    return (
        waiting,
        sched.running(),
        [sched.requests_of(tenant) for tenant in ("a", "b", "c")],
        [sched.position(r.id, now_ms=now) for r in waiting],
        [(name, sched.depth(name), sched.depth_limit(name, now_ms=now)) for name in sched._plans],
        sched.next_wakeup_ms(now_ms=now),
        sched.headroom_holds(),
        sched.counters.as_dict(),
    )


runs = st.one_of(
    st.tuples(st.sampled_from(["plain", "prediction", "rescue"]), any_ops),
    st.tuples(st.just("headroom"), headroom_ops),
)


@FAST
@given(runs, st.lists(st.integers(0, 120), min_size=1, max_size=3))
def test_a_restored_engine_decides_as_the_original(run, cuts):
    kind, sequence = run
    original = HARNESSES[kind]()
    copies: list[Harness] = []
    for at, op in enumerate(sequence):
        if at in cuts:
            copies.append(restored(original))
            assert packed(to_record(copies[-1].sched)) == packed(to_record(original.sched))
        original.apply(op)
        for harness in copies:
            harness.apply(op)
    for harness in copies:
        assert harness.log == original.log
        assert queue_view(harness) == queue_view(original)
        assert packed(to_record(harness.sched)) == packed(to_record(original.sched))


def test_a_record_of_another_version_is_refused():
    sched = scheduler()
    submit(sched, req("r1"), req("r2"))
    sched.dispatch(now_ms=0)
    record = packed(to_record(sched))
    assert from_record(record).waiting() == sched.waiting()
    for version in (None, 0, SNAPSHOT_VERSION + 1):
        with pytest.raises(SnapshotVersionError, match="drain the shared scheduler, then start"):
            from_record({**record, "version": version})


def test_a_book_keeps_when_its_queue_emptied_and_an_older_record_without_it_reads():
    sched = scheduler()
    submit(sched, req("r1"))
    sched.dispatch(now_ms=0)
    book = sched._books[("BATCH", "a")]
    book.since_ms, book.idle_ms = 0, 70_000  # a measured backlog in a break
    record = packed(to_record(sched))
    back = from_record(record)._books[("BATCH", "a")]
    assert (back.since_ms, back.idle_ms) == (0, 70_000)
    older = {**record, "books": [row[:6] for row in record["books"]]}  # before idle_ms was kept
    assert from_record(older)._books[("BATCH", "a")].idle_ms is None


def test_the_shared_snapshot_and_configuration_refuse_a_pickle_and_an_unknown_version():
    cfg = short_sla_config()
    for raw in (pickle.dumps((None, Routes(), cfg)), msgpack.packb({"version": SNAPSHOT_VERSION + 1})):
        with pytest.raises(SnapshotVersionError, match="drain the shared scheduler, then start"):
            unpack_state(raw)
    with pytest.raises(SnapshotVersionError, match="configuration message"):
        unpack_config(pickle.dumps(cfg))
    sched = scheduler(cfg)
    submit(sched, req("r1"))
    routes = Routes(of={"t/x": "gw"}, leased={"t/x": 5}, check_ms=7)
    routes.circuits.failure("g1", 10)
    routes.circuits.add_tokens("g1", 10, 20)
    engine, routes_back, logged = unpack_state(pack_state(sched, routes, cfg))
    assert engine is not None and engine.waiting() == sched.waiting() and logged == cfg
    assert packed(routes_back.as_record()) == packed(routes.as_record())
    assert unpack_state(pack_state(None, Routes(), None))[0::2] == (None, None)


def test_a_configuration_record_reads_back_equal():
    cfg = replace(
        short_sla_config(),
        headroom=HeadroomPolicy(enabled=True, rescue_ms=300, miss_share=0.1),
        downgrade_rules=(DowngradeRule("long", "prompt_tokens > 8000", "DOWNGRADE_TO_BATCH", order=2),),
        networks={"batch": ("10.0.0.0/8", "192.168.0.0/16")},
        tenants=(TenantSpec("a", 0.6, "A", Decimal("1200.50"), ("BATCH",), vip=True),),
        backends=(
            BackendSpec(
                "az",
                ("m",),
                4,
                tpm=1000,
                input_price_per_1k=Decimal("0.0015"),
                headers=(("x-team", "env:TEAM"),),
                dialect=Dialect.AZURE,
                api_version="2024-06-01",
            ),
        ),
    )
    assert config_from_record(packed(config_to_record(cfg))) == cfg
    assert unpack_config(pack_config(cfg)) == cfg


def test_circuits_read_back_with_their_token_windows():
    circuits = Circuits(threshold=2, cooldown_ms=500)
    circuits.failure("g1", 0)
    circuits.failure("g1", 1)
    circuits.add_tokens("g2", 5, 40)
    back = Circuits.from_record(packed(circuits.as_record()))
    assert (
        packed(back.as_record()) == packed(circuits.as_record())
        and back.is_open("g1", 100)
        and back.of("g2").tpm_used(10) == 40
    )


def test_a_retired_class_a_draining_backend_and_token_windows_are_restored():
    """A class removed from the configuration with requests still waiting, a backend removed with
    requests still running, and a backend's token window: the restored engine serves them alike."""
    cfg = short_sla_config()
    backends = [BackendSpec("g1", ("m",), 1, tpm=5000), BackendSpec("g2", ("m",), 1)]
    engines = [scheduler(cfg, backends=backends)]
    submit(engines[0], *(req(f"r{n}", tenant="ab"[n % 2], cls="RETRY", at=0, prompt=900) for n in range(6)))
    engines[0].dispatch(now_ms=0)
    engines[0].reconfigure(
        now_ms=10,
        config=replace(cfg, classes=tuple(c for c in cfg.classes if c.name != "RETRY")),
        backends=[BackendSpec("g1", ("m",), 2, tpm=5000)],
    )
    engines.append(from_record(packed(to_record(engines[0]))))
    for sched in engines:
        assert sched.waiting() == engines[0].waiting() and "RETRY" in sched._retired
    logs: list[list] = [[], []]
    for now in range(20, 4000, 100):
        for sched, log in zip(engines, logs, strict=True):
            for request in sched.running():
                sched.complete(request.id, now_ms=now, prompt_tokens=request.prompt_tokens, output_tokens=10)
            log.append([(g.request.id, g.backend) for g in sched.dispatch(now_ms=now)])
            log.append([r.id for r in sched.expire(now_ms=now)])
    assert logs[0] == logs[1] and any(logs[0])
    assert packed(to_record(engines[1])) == packed(to_record(engines[0]))
