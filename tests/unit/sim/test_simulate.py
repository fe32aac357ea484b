"""The simulator drives the real engine: outcomes, metrics and the CLI on small scenarios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.engine import apply_policy
from scheduling.engine.schema import ConfigError
from sim.scenario import load_scenario
from sim.simulate import run_file
from tests.unit.sim.conftest import CONFIG, tiny_surge, write

REPO = Path(__file__).resolve().parents[3]
POLICIES = ("fairgate", "fifo", "strict", "linear")


def _without_decision_cost(out: dict) -> dict:
    return {k: v for k, v in out.items() if k != "decision_us"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    path = write(tmp_path_factory.mktemp("surge"), tiny_surge())
    return {p: run_file(path, policy=p) for p in POLICIES}


def test_same_seed_gives_identical_json_apart_from_decision_cost(surge_path: Path) -> None:
    first, second = run_file(surge_path, policy="fairgate"), run_file(surge_path, policy="fairgate")
    assert json.dumps(_without_decision_cost(first), sort_keys=True) == json.dumps(
        _without_decision_cost(second), sort_keys=True
    )


def test_another_seed_gives_another_trace(surge_path: Path) -> None:
    assert (
        run_file(surge_path, policy="fairgate", seed=8)["classes"] != run_file(surge_path, policy="fairgate")["classes"]
    )


def test_output_has_the_issue_keys(runs: dict[str, dict]) -> None:
    out = runs["fairgate"]
    assert {
        "scenario",
        "policy",
        "seed",
        "classes",
        "tenants",
        "jain_index",
        "wasted_service_ratio",
        "goodput_per_s",
        "aging",
        "decision_us",
        "timeline",
    } <= set(out)
    assert out["scenario"] == "tiny-surge" and out["policy"] == "fairgate" and out["seed"] == 7
    cls = out["classes"]["INTERACTIVE"]
    assert {
        "arrived",
        "admitted",
        "completed",
        "completed_within_sla",
        "rejected_queue_full",
        "queue_timeout",
        "abandoned",
        "wait_ms",
    } <= set(cls)
    assert set(cls["wait_ms"]) == {"p50", "p95", "p99", "max"}
    assert {"completed", "wait_ms", "tokens_served"} <= set(out["tenants"]["fin"])
    assert set(out["tenants"]["fin"]["wait_ms"]) == {"mean", "p95"}
    assert set(out["aging"]) == {"boosted", "preempted"} and {"p50", "p99"} <= set(out["decision_us"])
    row = out["timeline"][0]
    assert {"t_ms", "in_queue", "interactive_p95_ms", "batch_completed", "aging_preempt"} <= set(row)
    assert [r["t_ms"] for r in out["timeline"][:3]] == [0, 60_000, 120_000]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_arrival_ends_in_exactly_one_state(runs: dict[str, dict], policy: str) -> None:
    out = runs[policy]
    assert out["conservation"] == {"ok": True, "problems": []}
    for c in out["classes"].values():
        assert c["arrived"] == c["admitted"] + c["rejected_queue_full"] + c["rejected_no_backend"]
        assert c["admitted"] == c["completed"] + c["queue_timeout"] + c["abandoned"]
        assert c["completed_within_sla"] <= c["completed"]
    assert out["totals"]["arrived"] == sum(t["arrived"] for t in out["tenants"].values())
    assert sum(t["completed"] for t in out["tenants"].values()) == out["totals"]["completed"]


def test_fairgate_protects_chat_from_the_surge(runs: dict[str, dict]) -> None:
    ours, fifo = runs["fairgate"], runs["fifo"]
    assert ours["classes"]["INTERACTIVE"]["wait_ms"]["p95"] * 20 < fifo["classes"]["INTERACTIVE"]["wait_ms"]["p95"]
    assert ours["small_tenants"]["tenants"] == ["small"]
    assert ours["small_tenants"]["wait_ms"]["mean"] < fifo["small_tenants"]["wait_ms"]["mean"]
    assert ours["goodput_per_s"] > fifo["goodput_per_s"]


def test_fifo_serves_given_up_requests_as_completed_and_wasted(runs: dict[str, dict]) -> None:
    fifo = runs["fifo"]
    assert fifo["totals"]["abandoned"] == 0 and fifo["totals"]["queue_timeout"] == 0
    assert fifo["totals"]["served_after_give_up"] > 0 and fifo["wasted_service_ratio"] > 0
    assert fifo["totals"]["completed"] == fifo["totals"]["arrived"]
    assert runs["fairgate"]["wasted_service_ratio"] == 0


def test_downgrade_rules_apply_to_declared_classes(runs: dict[str, dict]) -> None:
    out = runs["fairgate"]
    assert out["totals"]["downgraded"] > 0
    assert out["classes"]["BATCH"]["downgraded_in"] == out["totals"]["downgraded"]


def _one_slot(policy: str, tmp_path: Path) -> dict:
    doc = {
        "name": "one-slot",  # the depth rule admits the chat request behind the long one, so its client gives up
        "config": {**CONFIG, "queue": {**CONFIG.get("queue", {}), "admission": "depth"}},
        "backends": [{"name": "gpu", "models": ["m"], "slots": 1}],
        "tenants": [{"slug": "a", "quota_share": 0.5}, {"slug": "b", "quota_share": 0.5}],
        "requests": [
            {
                "id": "long",
                "at_ms": 0,
                "tenant": "a",
                "class": "BATCH",
                "service_ms": 10_000,
                "prompt_tokens": 10,
                "output_tokens": 10,
            },
            {
                "id": "chat",
                "at_ms": 100,
                "tenant": "b",
                "class": "INTERACTIVE",
                "service_ms": 500,
                "prompt_tokens": 10,
                "output_tokens": 10,
                "patience_ms": 1000,
            },
        ],
    }
    return run_file(write(tmp_path, doc), policy=policy)


def test_a_client_that_gives_up_is_abandoned_when_cancel_is_honoured(tmp_path: Path) -> None:
    chat = _one_slot("fairgate", tmp_path)["classes"]["INTERACTIVE"]
    assert (chat["abandoned"], chat["completed"], chat["queue_timeout"]) == (1, 0, 0)


def test_fifo_serves_the_given_up_request_later_and_counts_its_slot_time_as_wasted(tmp_path: Path) -> None:
    out = _one_slot("fifo", tmp_path)
    chat = out["classes"]["INTERACTIVE"]
    assert (chat["abandoned"], chat["completed"], chat["served_after_give_up"]) == (0, 1, 1)
    assert chat["wait_ms"]["max"] == 9_900
    assert out["wasted_service_ratio"] == pytest.approx(500 / 10_500, abs=1e-4)
    assert out["goodput_requests"] == 1  # only the batch request


def test_shipped_idle_burst_is_never_refused() -> None:
    out = run_file(REPO / "sim" / "scenarios" / "idle-burst.json", policy="fairgate")
    assert out["totals"]["arrived"] > 3000
    assert out["totals"]["rejected_queue_full"] == 0
    assert out["conservation"]["ok"]


def test_cli_runs_a_scenario_and_writes_json(surge_path: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.simulate",
            str(surge_path),
            "--policy",
            "strict",
            "--seed",
            "3",
            "--json",
            str(out_path),
            "--timeline-step-ms",
            "30000",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(out_path.read_text())
    assert (out["policy"], out["seed"]) == ("strict", 3)
    assert out["timeline"][1]["t_ms"] == 30_000
    assert "tiny-surge / strict" in proc.stdout


def test_cli_refuses_an_unknown_policy(surge_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sim.simulate", str(surge_path), "--policy", "lifo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "lifo" in proc.stderr


def test_config_may_be_a_yaml_file_with_its_own_tenants_and_backends(tmp_path: Path) -> None:
    doc = {
        "name": "yaml",
        "config": str(REPO / "config" / "scheduler.example.yaml"),
        "requests": [
            {
                "id": "q1",
                "at_ms": 0,
                "tenant": "support",
                "class": "INTERACTIVE",
                "model": "sim-llama",
                "service_ms": 100,
                "prompt_tokens": 9000,
                "output_tokens": 10,
            }
        ],
    }
    out = run_file(write(tmp_path, doc))
    assert out["policy"] == "fairgate"
    assert out["classes"]["NEAR_RT"]["completed"] == 1  # long prompt: downgraded by the example's rule
    assert out["totals"]["downgraded"] == 1


def test_queue_overrides_are_checked_like_the_yaml(surge_path: Path) -> None:
    out = run_file(surge_path, policy="fairgate", queue={"admission": "predicted", "fast_fail": True})
    assert out["conservation"]["ok"]
    with pytest.raises(ConfigError):
        run_file(surge_path, queue={"admission": "sometimes"})
    proc = subprocess.run(
        [sys.executable, "-m", "sim.simulate", str(surge_path), "--queue", "predict_margin=2", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "predict_margin" in proc.stderr


def test_every_504_is_counted_with_the_time_its_client_waited(runs: dict[str, dict]) -> None:
    out = runs["fairgate"]
    timeouts = out["queue_timeouts"]
    assert sum(t["count"] for t in timeouts.values()) == out["totals"]["queue_timeout"]
    assert out["totals"]["fast_failed"] == sum(t["fast_failed"] for t in timeouts.values()) == 0  # off by default
    chat = timeouts["INTERACTIVE"]
    assert chat["count"] > 0 and chat["wait_s"] >= chat["count"] * 3.0  # each waited past its 3 s SLA


def _overloaded_batch(tmp_path: Path, fast_fail: bool) -> dict:
    """One slot; 20 BATCH jobs of 190 s each admitted at once (SLA 30 min): the last ten cannot start in time."""
    doc = {
        "name": "slow-jobs",
        "config": {**CONFIG, "queue": {"depth_cap": 20000, "fast_fail": fast_fail}},
        "backends": [{"name": "gpu", "models": ["m"], "slots": 1}],
        "tenants": [{"slug": "a", "quota_share": 1.0}],
        "generators": [{"kind": "burst", "tenant": "a", "class": "BATCH", "count": 20, "service_ms": 190_000}],
    }
    return run_file(write(tmp_path, doc), policy="fairgate")


def test_early_fast_fail_ends_the_hopeless_before_their_deadline(tmp_path: Path) -> None:
    at_deadline, early = _overloaded_batch(tmp_path, False), _overloaded_batch(tmp_path, True)
    for out in (at_deadline, early):
        assert out["conservation"]["ok"]
    late, soon = at_deadline["queue_timeouts"]["BATCH"], early["queue_timeouts"]["BATCH"]
    assert late["fast_failed"] == 0 and soon["fast_failed"] == soon["count"] > 0
    assert late["count"] == soon["count"] == 10
    assert soon["wait_s"] == 10 * 190.0  # all ten told when the first job ended (190 s), not at 30 min
    assert early["classes"]["BATCH"]["completed_within_sla"] == at_deadline["classes"]["BATCH"]["completed_within_sla"]


def test_shipped_idle_burst_is_never_refused_with_prediction_either() -> None:
    out = run_file(
        REPO / "sim" / "scenarios" / "idle-burst.json",
        policy="fairgate",
        queue={"admission": "predicted", "fast_fail": True},
    )
    assert out["totals"]["rejected_queue_full"] == 0 and out["totals"]["queue_timeout"] == 0
    assert out["conservation"]["ok"]


def test_the_new_scenarios_turn_prediction_on_for_fairgate_only() -> None:
    for name in ("surge-30min", "quiet-burst", "higher-surge"):
        scenario = load_scenario(REPO / "sim" / "scenarios" / f"{name}.json")
        assert (scenario.config.queue.admission, scenario.config.queue.fast_fail) == ("predicted", True)
        assert scenario.notes and scenario.seed == 1
        for policy in ("fifo", "strict", "linear"):
            assert apply_policy(scenario.config, policy).queue.admission == "depth"
