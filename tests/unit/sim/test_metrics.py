"""Metric helpers and trace generators of the simulator."""

from __future__ import annotations

import pytest

from sim.engine_speed import run as speed_run
from sim.generators import generate
from sim.metrics import JainTracker, percentile, wait_summary


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (50, 95, 100)
    assert percentile([], 95) == 0
    assert wait_summary([5, 1, 3]) == {"p50": 3, "p95": 5, "p99": 5, "max": 5}


def _tracker_with(service: dict[str, int], weights: dict[str, float]) -> JainTracker:
    jain = JainTracker(weights, window_ms=1000)
    for tenant in service:
        jain.add_waiting(("BATCH", tenant))
    jain.roll_until(1000)  # first window: nobody was backlogged at its start
    for tenant, tokens in service.items():
        jain.served(("BATCH", tenant), tokens)
    jain.roll_until(2000)
    return jain


def test_jain_is_one_when_service_follows_the_weights() -> None:
    jain = _tracker_with({"a": 300, "b": 100}, {"a": 0.3, "b": 0.1})
    assert jain.index() == 1.0 and len(jain.samples) == 1


def test_jain_falls_when_one_backlogged_tenant_is_starved() -> None:
    jain = _tracker_with({"a": 400, "b": 0}, {"a": 0.5, "b": 0.5})
    assert jain.index() == pytest.approx(0.5)


def test_a_tenant_whose_queue_emptied_is_not_counted_as_backlogged() -> None:
    jain = JainTracker({"a": 0.5, "b": 0.5}, window_ms=1000)
    jain.add_waiting(("BATCH", "a"))
    jain.add_waiting(("BATCH", "b"))
    jain.roll_until(1000)
    jain.remove_waiting(("BATCH", "b"))
    jain.add_waiting(("BATCH", "b"))
    jain.served(("BATCH", "a"), 100)
    jain.roll_until(2000)
    assert jain.samples == [] and jain.index() is None


def test_burst_spreads_its_count_evenly() -> None:
    reqs = generate(
        {"kind": "burst", "tenant": "f", "class": "BATCH", "count": 4, "at_ms": 100, "spread_ms": 8, "service_ms": 5},
        index=0,
        seed=1,
    )
    assert [r.at_ms for r in reqs] == [100, 102, 104, 106]
    assert {r.service_ms for r in reqs} == {5} and len({r.id for r in reqs}) == 4


def test_poisson_is_seeded_and_respects_on_off_periods() -> None:
    gen = {
        "kind": "poisson",
        "tenant": ["x", "y"],
        "class": "BATCH",
        "rate_per_s": 20,
        "start_ms": 0,
        "end_ms": 4000,
        "on_ms": 1000,
        "off_ms": 1000,
        "service_ms": {"base_ms": 100, "per_output_token_ms": 2},
    }
    first, again, other = (generate(gen, index=0, seed=s) for s in (1, 1, 2))
    assert first == again and first != other
    assert all((r.at_ms % 2000) < 1000 for r in first)
    assert {r.tenant for r in first} == {"x", "y"}
    assert all(r.service_ms == 100 + 2 * r.output_tokens for r in first)
    assert 50 < len(first) < 120  # 2 tenants x 20/s x 2 s on = 80 expected


def test_engine_speed_reports_a_row_per_size() -> None:
    rows = speed_run((10, 200), pairs=50, rounds=2)
    assert [r["waiting"] for r in rows] == [10, 200]
    assert all(r["ratio"] > 0 and r["decision_p99_us"] >= r["decision_p50_us"] for r in rows)
