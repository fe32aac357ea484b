"""The engine's state stays bounded whatever the request rate: the shared dispatcher records it
as its snapshot every few seconds, and one entry kept per event made that snapshot grow to
megabytes at high rates (issue 13). Rate windows count in entries of a fixed resolution, never
more than exactly where admission reads them and never less where upstream limits do; stale
heap entries are compacted."""

from __future__ import annotations

import msgpack
import pytest

from scheduling.engine import TenantSpec
from scheduling.engine import admission as adm
from scheduling.engine.snapshot import to_record
from scheduling.engine.store import WINDOW_ENTRY_MS, MemoryStore
from tests.unit.engine.engine_helpers import backend, config, req, scheduler

EVENTS = 200_000
PER_MS = 10  # 10,000 requests a second, in virtual time
SNAPSHOT_BOUND = 256 * 1024  # bytes; before the fix: megabytes after the same events


def _flood(sched, *, events: int = EVENTS, per_ms: int = PER_MS, tenant: str = "a") -> None:
    """``events`` submits of ``tenant``, ``per_ms`` each millisecond from 1 ms on, then a dispatch;
    each request granted completes the next millisecond."""
    granted: list = []
    for now in range(1, events // per_ms + 1):
        for r in granted:
            sched.complete(r.id, now_ms=now, prompt_tokens=r.prompt_tokens, output_tokens=10)
        for n in range(per_ms):
            assert sched.submit(req(f"r{now}.{n}", tenant=tenant, at=now, prompt=50, out=20), now_ms=now).admitted
        granted = [g.request for g in sched.dispatch(now_ms=now)]


def _size(sched) -> int:
    return len(msgpack.packb(to_record(sched)))


@pytest.mark.parametrize("limits", [{}, {"tpm": 10**9, "rpm": 10**8}], ids=["slots only", "with TPM and RPM windows"])
def test_the_engine_records_small_after_many_events_at_a_high_rate(limits):
    sched = scheduler(config(enforce_depth=True), backends=[backend(slots=10_000, **limits)])
    _flood(sched)
    assert sched.counters.total("completed") >= EVENTS - 2 * PER_MS
    assert _size(sched) < SNAPSHOT_BOUND


def test_a_long_wait_does_not_keep_every_request_served_meanwhile():
    """One request waits (its tenant's fair counter is far ahead, after a huge request) while
    another tenant's flow, always backlogged, passes it: the lane's age heap kept an entry, and
    its finished ticket, for every request served meanwhile."""
    tenant_specs = [TenantSpec("heavy", 0.5), TenantSpec("a", 0.5)]
    sched = scheduler(config(aging="none"), backends=[backend(slots=PER_MS + 1)], tenant_specs=tenant_specs)
    assert sched.submit(req("huge", tenant="heavy", prompt=10**12, out=1), now_ms=0).admitted
    assert [g.request.id for g in sched.dispatch(now_ms=0)] == ["huge"]  # runs throughout: PER_MS slots left
    for n in range(PER_MS + 5):  # "a" keeps 5 waiting from now on
        assert sched.submit(req(f"early{n}", at=0), now_ms=0).admitted
    assert sched.submit(req("waits", tenant="heavy"), now_ms=0).admitted
    granted = sched.dispatch(now_ms=0)
    for g in granted:
        sched.complete(g.request.id, now_ms=1, prompt_tokens=100, output_tokens=10)
    _flood(sched)
    assert sched.state_of("waits") == "queued" and sched.waiting_count == 6
    assert sched.counters.total("completed") >= EVENTS - 2 * PER_MS
    assert _size(sched) < SNAPSHOT_BOUND


def test_a_rate_window_counts_sparse_events_exactly_and_dense_ones_never_more():
    window = adm.RateWindow()
    for at in (0, 0, 300, 1000):
        window.add(at)
    assert window.count(1000) == 4
    assert window.count(60_000) == 2  # the two at 0 left at 60 000, exactly
    assert window.count(60_300) == 1
    dense = adm.RateWindow()
    times = list(range(100_000, 100_000 + 120_000, 3))  # an event every 3 ms for two minutes
    for at in times:
        dense.add(at)
        if at % 997 == 0:
            now = at
            exact = sum(1 for t in times if now - adm.WINDOW_MS < t <= now)
            assert exact - adm.RATE_ENTRY_MS // 3 - 1 <= dense.count(now) <= exact
    assert len(dense.times) <= adm.WINDOW_MS // adm.RATE_ENTRY_MS + 1


def test_a_rate_window_nobody_reads_stays_bounded():
    """Without depth enforcement nothing counts the dispatch windows (the shared dispatcher's bench
    runs so): they were trimmed only when counted, so they kept every dispatch for ever."""
    window = adm.RateWindow()
    for at in range(180_000):  # one event a ms for three minutes, never counted
        window.add(at)
    assert len(window.times) <= adm.WINDOW_MS // adm.RATE_ENTRY_MS + 1
    assert window.count(179_999) <= 60_000


def test_a_sliding_window_never_counts_less_than_exactly():
    store = MemoryStore()
    handles = [store.window_add("b", at, 10.0) for at in (0, 100, 249, 250, 10_000)]
    assert handles[0] == handles[1] == handles[2] != handles[3]  # the first three share an entry
    store.window_adjust("b", handles[1], -5.0)
    assert store.window_usage("b", 10_000, 60_000) == (45.0, 5, 249)
    assert store.window_usage("b", 60_000, 60_000) == (45.0, 5, 249)  # exactly 4: the one at 0 left, its entry not
    assert store.window_usage("b", 60_249, 60_000) == (20.0, 2, 250)
    for at in range(20_000, 80_000):  # a sample every ms for a minute, each after a read (as the engine does)
        store.window_usage("b", at, 60_000)
        store.window_add("b", at, 1.0)
    assert len(store._windows["b"].samples) <= 60_000 // WINDOW_ENTRY_MS + 1
    assert store.window_usage("b", 79_999, 60_000)[1] == 60_000  # every one of them (none had left)


def test_a_backends_token_window_stays_bounded_unread_and_sums_the_last_minute():
    """A gateway's circuits count each backend's completed tokens (its TPM on /metrics): one entry
    per completion, dropped only when read, grew without end where nobody scraped /metrics."""
    from scheduling.engine.circuits import Circuits

    circuits = Circuits(threshold=3, cooldown_ms=1000)
    for at in range(180_000):  # a completion of 10 tokens every ms for three minutes, never read
        circuits.add_tokens("b", at, 10)
    health = circuits.of("b")
    assert len(health.tokens.times) <= adm.WINDOW_MS // adm.RATE_ENTRY_MS + 1
    assert 10 * (adm.WINDOW_MS - adm.RATE_ENTRY_MS) <= health.tpm_used(179_999) <= 10 * adm.WINDOW_MS
    sparse = Circuits(threshold=3, cooldown_ms=1000)
    for at, tokens in ((0, 5), (1000, 7), (30_000, 11)):
        sparse.add_tokens("b", at, tokens)
    assert sparse.of("b").tpm_used(30_000) == 23
    assert sparse.of("b").tpm_used(60_000) == 18  # the one at 0 left at 60 000, exactly
    assert sparse.of("b").tpm_used(61_000) == 11
    assert Circuits.from_record(sparse.as_record()).of("b").tpm_used(61_000) == 11
