"""The surge replay's pure parts for the run whose batch is uploaded through the Batch API: the
batch file, the batch's counts and failures, /metrics' batch lines, the ratio of the peak window's
p95 to the whole surge's, and the upload run's table and headline; and the no-batch baseline: each
window's p95 over it and issue 15's target line. No server, no clock."""

from __future__ import annotations

import json
import math

import yaml

from bench.surge import SurgePlan
from bench.surge.plan import Prompts
from bench.surge.probe import parse
from bench.surge.replay import drained_at
from bench.surge.report import COLUMNS, P95, UPLOAD_COLUMNS, BatchTally, Sample, SurgeResult, ratio, ratio_text
from bench.surge.traffic import GAVE_UP, OK, Ledger, Outcome, batch_bodies
from bench.surge.upload import ENDPOINT, BatchCounts, batch_jsonl, failure_codes
from bench.surge_compare import (
    SCENARIO,
    baseline_plan,
    baseline_target_line,
    engine_policy,
    first_problem,
    gateway_yaml,
    log_problems,
    scaled_headroom,
    target_line,
    with_baseline,
    worker_timing,
)
from scheduling.engine.schema import config_from_dict, config_from_yaml

PLAN = SurgePlan(batch_count=40, time_scale=60)


def test_the_gateway_gets_the_scenarios_headroom_with_its_durations_divided_by_the_time_scale():
    plan = SurgePlan(batch_count=6200, time_scale=20)
    scenario = json.loads(SCENARIO.read_text(encoding="utf-8"))["config"]
    config = yaml.safe_load(gateway_yaml(plan, "fairgate", "http://127.0.0.1:1", 24))["scheduler"]
    sim, real = scenario["headroom"], config["headroom"]
    for key in ("horizon_ms", "hold_ms", "rescue_ms", "recent_ms"):
        assert real[key] == math.ceil(sim[key] / 20), key
    assert {k: v for k, v in real.items() if not k.endswith("_ms")} == {
        k: v for k, v in sim.items() if not k.endswith("_ms")
    }
    assert [c["sla_ms"] for c in config["classes"]] == [math.ceil(c["sla_ms"] / 20) for c in scenario["classes"]]
    assert config_from_yaml(gateway_yaml(plan, "fairgate", "http://127.0.0.1:1", 24)).headroom.enabled


def test_scaled_headroom_keeps_off_as_off_and_every_duration_within_the_schema():
    plan = SurgePlan(batch_count=6200, time_scale=60)
    section = {"enabled": True, "horizon_ms": 4000, "hold_ms": 90, "bucket_ms": 300_000, "recent_ms": 30_000}
    scaled = scaled_headroom(plan, {**section, "rescue_ms": 0, "max_slots": 3})
    assert scaled == {
        "enabled": True,
        "horizon_ms": 67,
        "hold_ms": 2,
        "bucket_ms": 60_000,  # 5,000 is below the schema's least; a minute divides a day
        "recent_ms": 1_000,  # 500 is below the schema's least
        "rescue_ms": 0,
        "max_slots": 3,
    }
    assert scaled_headroom(SurgePlan(batch_count=6200, time_scale=2), section)["bucket_ms"] == 150_000
    odd = scaled_headroom(SurgePlan(batch_count=6200, time_scale=7), {"bucket_ms": 600_000})["bucket_ms"]
    assert odd >= 600_000 / 7 and 86_400_000 % odd == 0
    classes = [
        {"name": "INTERACTIVE", "level": 0, "sla_ms": 50, "price_factor": "1"},
        {"name": "BATCH", "level": 2, "sla_ms": 240_000, "price_factor": "1"},
    ]
    assert config_from_dict({"classes": classes, "headroom": scaled}).headroom.bucket_ms == 60_000  # schema: valid


def test_the_batch_file_holds_the_http_replays_bodies_one_line_each():
    lines = [json.loads(raw) for raw in batch_jsonl(PLAN).splitlines()]
    assert len(lines) == 40
    assert [line["custom_id"] for line in lines] == [f"finance-{n}" for n in range(1, 41)]
    assert all(line["method"] == "POST" and line["url"] == ENDPOINT == "/v1/chat/completions" for line in lines)
    assert [line["body"] for line in lines] == list(batch_bodies(PLAN, Prompts(PLAN.seed)))
    assert all("stream" not in line["body"] and line["body"]["model"] == "m" for line in lines)
    assert batch_jsonl(PLAN) == batch_jsonl(PLAN)  # the same file every run


def test_failed_lines_are_counted_by_their_error_code():
    error_file = b"\n".join(
        json.dumps(line).encode()
        for line in (
            {"custom_id": "a", "response": None, "error": {"code": "budget_exhausted", "message": "."}},
            {"custom_id": "b", "response": None, "error": {"code": "budget_exhausted", "message": "."}},
            {"custom_id": "c", "response": {"status_code": 502, "body": {}}, "error": None},
        )
    )
    assert failure_codes(error_file + b"\n") == {"budget_exhausted": 2, "502": 1}
    assert failure_codes(b"") == {}


def test_a_batch_has_ended_in_any_final_status_only():
    assert BatchCounts("completed", 3, 3, 0).ended and BatchCounts("expired", 3, 1, 2).ended
    assert not BatchCounts("in_progress", 3, 3, 0).ended and not BatchCounts("finalizing", 3, 3, 0).ended


def test_metrics_give_the_batch_lines_by_state():
    text = "\n".join(
        [
            "# TYPE fairgate_queue_depth gauge",
            'fairgate_queue_depth{cls="BATCH"} 40.0',
            "# TYPE fairgate_batch_lines gauge",
            'fairgate_batch_lines{state="pending"} 5000.0',
            'fairgate_batch_lines{state="sent"} 24.0',
            "",
        ]
    )
    view = parse(text)
    assert view.batch_waiting == 40 and view.batch_lines == {"pending": 5000, "sent": 24}
    assert parse('fairgate_queue_depth{cls="BATCH"} 1.0\n').batch_lines == {}


def test_the_ratio_says_which_side_is_a_lower_bound():
    assert ratio(P95(6.0), P95(3.0)) == 2.0 and ratio_text(P95(6.0), P95(3.0)) == "2.00x"
    assert ratio_text(P95(48.95, censored=True), P95(3.48)) == ">14.07x"
    assert ratio_text(P95(6.0), P95(30.0, censored=True)) == "<0.20x"
    assert ratio_text(P95(58.6, True), P95(57.9, True)) == "1.01x (both lower bounds)"
    assert ratio_text(P95(None), P95(3.0)) == "–" and ratio(P95(3.0), P95(None)) is None


def test_the_target_line_is_met_missed_or_not_shown():
    assert "met (6.00s / 4.00s = 1.50x)" in target_line("fairgate-upload", P95(6.0), P95(4.0))
    assert "missed" in target_line("fairgate-upload", P95(9.9), P95(4.86))
    assert "not shown" in target_line("fairgate-upload", P95(30.0, censored=True), P95(20.0))
    assert "not measurable" in target_line("fairgate-upload", P95(None), P95(4.0))


def _uploaded_result() -> SurgeResult:
    plan = SurgePlan(batch_count=10, time_scale=60)
    ledger = Ledger([Outcome("chat", 400.0 + i, OK, ttft_sim_s=1.0 + i / 10) for i in range(10)])
    ledger.outcomes.append(Outcome("chat", 450.0, GAVE_UP, ttft_sim_s=30.0))
    view = parse('fairgate_queue_depth{cls="BATCH"} 7.0\nfairgate_batch_lines{state="pending"} 3.0\n')
    samples = [Sample(600.0, "09:05", view, batch_completed=4, batch_failed=1, batch_not_sent=0)]
    tally = BatchTally("completed", 8, 2, {"budget_exhausted": 2})
    return SurgeResult(plan, samples, ledger, 300.0, 600.0, batch=tally, uploaded=True)


def test_an_uploaded_run_shows_its_pending_lines_and_the_batchs_own_counts():
    result = _uploaded_result()
    assert result.columns == UPLOAD_COLUMNS and "batch_not_sent" not in UPLOAD_COLUMNS
    assert SurgeResult(result.plan, [], Ledger(), None, 0.0).columns == COLUMNS
    (row,) = result.rows()
    assert (row["in_queue"], row["batch_pending"], row["batch_completed"]) == ("7", "3", "4")
    head = result.headline()
    assert head["batch completed"] == "8 of 10 (80.0%)" and head["batch failed"] == "budget_exhausted 2"
    assert head["interactive p95, whole surge"] == ">30.00s"
    assert head["peak window p95 / whole surge p95"] == "1.00x (both lower bounds)"
    assert head["time to drain (from 09:00)"] == "0h05m"
    never = SurgeResult(result.plan, [], Ledger(), None, 0.0, uploaded=True).headline()
    assert never["batch completed"] == "not created"


def test_log_problems_counts_the_lines_that_say_something_went_wrong():
    log = "INFO ready.\nWARNING batch line 3: sent again\nTraceback (most recent call last):\nERROR x\nWARNING y\n"
    assert log_problems(log) == {"WARNING": 2, "Traceback": 1, "ERROR": 1}
    assert log_problems("INFO all well\n") == {}


def test_first_problem_gives_a_tracebacks_exception():
    log = "ready\nException ignored in: <f>\nTraceback (most recent call last):\n  File x\nOSError: gone\nWARNING w\n"
    assert first_problem(log) == "Traceback (most recent call last): ... OSError: gone"
    assert first_problem("INFO a\nWARNING b\n") == "WARNING b" and first_problem("INFO a\n") == ""


def test_worker_timing_reads_run_times_and_the_gaps_between_hand_offs():
    def line(stamp: str, task: str, what: str) -> str:
        return f"[2026-12-02 02:35:{stamp}: INFO/MainProcess] Task batches.run_line[{task}] {what}"

    log = "\n".join(
        [
            line("02,896", "a", "received"),
            line("02,897", "b", "received"),  # the same moment as a
            line("03,209", "a", "succeeded in 0.3s: None"),
            line("03,425", "b", "succeeded in 0.5s: None"),
            line("03,899", "c", "received"),
            line("04,900", "d", "received"),
            line("05,100", "c", "succeeded in 0.4s: None"),
        ]
    )
    ran, run_s, gap_s = worker_timing(log)
    assert ran == 3 and abs(run_s - 0.4) < 1e-9 and abs(gap_s - 1.0015) < 1e-4
    assert worker_timing("[2026-12-02 02:35:02,896: INFO/MainProcess] celery@vm ready.") is None


def test_a_batch_cancelled_when_the_replay_stopped_has_not_drained():
    plan = SurgePlan(batch_count=2, time_scale=60)
    answered = Outcome("batch", 300.0, OK, ttft_sim_s=20.0, done_sim_s=320.0)
    cut = Outcome("batch", 300.0, done_sim_s=900.0)  # still pending when cancelled
    assert drained_at(plan, Ledger([answered, cut])) is None
    assert drained_at(plan, Ledger([answered, Outcome("batch", 300.0, OK, done_sim_s=400.0)])) == 100.0


def _chats(start_sim_s: float, ttfts: list[float], gave_up: float | None = None) -> list[Outcome]:
    """Chats sent one a second from ``start_sim_s``; one more that gave up after ``gave_up`` s."""
    chats = [Outcome("chat", start_sim_s + i, OK, ttft_sim_s=t) for i, t in enumerate(ttfts)]
    if gave_up is not None:
        chats.append(Outcome("chat", start_sim_s + len(ttfts), GAVE_UP, ttft_sim_s=gave_up))
    return chats


def _samples(*clocks: str) -> list[Sample]:
    return [Sample(PLAN.since_start(c), c, None, batch_completed=0, batch_failed=0, batch_not_sent=0) for c in clocks]


def test_a_no_batch_run_is_the_baseline_of_every_window():
    # No batch: chats of 1..2 s from 09:00 to 09:10 (the baseline's p95 is 2 s). With a batch: a calm
    # window (09:00-09:05, p95 3 s: 1.5x) and a bad one (09:05-09:10, p95 6 s: 3x).
    steady = [1.0] * 10 + [2.0] * 10
    base_ledger = Ledger(_chats(301.0, steady) + _chats(601.0, steady))
    base = SurgeResult(PLAN, _samples("09:05", "09:10"), base_ledger, None, 900.0, no_batch=True)
    ledger = Ledger(_chats(301.0, [1.0] * 18 + [3.0] * 2) + _chats(601.0, [2.0] * 18 + [6.0] * 2))
    http = SurgeResult(PLAN, _samples("09:05", "09:10"), ledger, 600.0, 900.0)
    results = with_baseline({"fairgate-nobatch": base, "fairgate": http})
    assert http.baseline == base.baseline == P95(2.0, False, 40)
    assert base.columns[-1] == http.columns[-1] == "vs_no_batch" and "in_queue" not in base.columns
    assert [row["vs_no_batch"] for row in http.rows()] == ["1.50x", "3.00x"]
    assert [row["vs_no_batch"] for row in base.rows(every_step=True)] == ["1.00x", "1.00x"]
    head = http.headline()
    assert head["interactive p95, peak 5-min window"] == "6.00s (to 09:10)"
    assert head["peak window p95 / no-batch p95"] == "3.00x"
    assert head["whole surge p95 / no-batch p95"] == "1.50x"  # 40 chats: the 38th is a 3 s one
    assert base.headline()["batch completed"] == "– (no batch)" and base.headline()["time to drain (from 09:00)"] == "–"
    assert set(results) == {"fairgate-nobatch", "fairgate"}


def test_without_a_no_batch_run_nothing_is_divided():
    http = SurgeResult(PLAN, _samples("09:05"), Ledger(_chats(301.0, [1.0] * 10)), 300.0, 600.0)
    with_baseline({"fairgate": http})
    assert http.baseline is None and "vs_no_batch" not in http.columns
    assert http.headline()["peak window p95 / no-batch p95"] == "–"


def test_a_window_whose_users_gave_up_divides_as_a_lower_bound():
    # 20 chats in 09:05-09:10, two of them gave up after 30 s: the window's p95 is ">30 s".
    ledger = Ledger(_chats(601.0, [1.0] * 18, gave_up=30.0) + [Outcome("chat", 620.0, GAVE_UP, ttft_sim_s=40.0)])
    http = SurgeResult(PLAN, _samples("09:05", "09:10"), ledger, None, 900.0, baseline=P95(2.0))
    (_, peak) = http.peak_window()
    assert peak.censored and http.rows()[-1]["vs_no_batch"] == ">15.00x"


def test_the_peak_window_is_shown_wherever_it_falls():
    clocks = ("09:05", "09:10", "09:15", "09:20")  # 09:10 and 09:15 are not among the report's times
    ledger = Ledger(_chats(601.0, [1.0] * 10) + _chats(901.0, [9.0] * 10))
    result = SurgeResult(PLAN, _samples(*clocks), ledger, None, 1500.0)
    assert [row["time"] for row in result.rows()] == ["09:05", "09:15", "09:20"]


def test_the_baseline_target_is_met_missed_or_not_shown():
    assert "met (2.80s / 2.00s = 1.40x)" in baseline_target_line("fairgate", P95(2.8), P95(2.0))
    assert "missed (3.20s / 2.00s = 1.60x)" in baseline_target_line("fairgate", P95(3.2), P95(2.0))
    # a lower bound over the target is missed all the same; under it, it shows nothing
    assert ": missed (>39.00s" in baseline_target_line("fairgate", P95(39.0, censored=True), P95(2.0))
    assert "not shown (the window's p95" in baseline_target_line("x", P95(2.5, censored=True), P95(2.0))
    # a censored baseline makes the ratio an upper bound
    assert ": met" in baseline_target_line("x", P95(2.5), P95(2.0, censored=True))
    assert "not shown (the baseline" in baseline_target_line("x", P95(4.0), P95(2.0, censored=True))
    assert "not measurable" in baseline_target_line("x", P95(None), P95(2.0))


def test_the_no_batch_run_ends_on_a_step_after_0900_and_keeps_the_traffic():
    plan = SurgePlan(batch_count=6200, time_scale=60)
    short = baseline_plan(plan, 30)
    assert short.max_sim_s == plan.warmup_sim_s + 1800 and short.clock(short.max_sim_s) == "09:30"
    assert (short.seed, short.interactive_per_real_s, short.batch_count) == (
        plan.seed,
        plan.interactive_per_real_s,
        plan.batch_count,
    )
    assert baseline_plan(plan, 1).max_sim_s == plan.warmup_sim_s + plan.step_sim_s  # at least one window
    assert engine_policy("fairgate-nobatch") == engine_policy("fairgate-upload") == "fairgate"


def test_the_window_before_0900_is_not_a_surge_window_even_when_its_sample_was_late():
    late = Sample(PLAN.warmup_sim_s + 0.4, "09:00", None, batch_completed=0, batch_failed=0, batch_not_sent=0)
    ledger = Ledger(_chats(1.0, [9.0] * 10) + _chats(301.0, [1.0] * 10))
    result = SurgeResult(PLAN, [late, *_samples("09:05")], ledger, None, 600.0)
    assert result.peak_window()[1].value_s == 1.0


def test_a_window_at_one_of_the_field_reports_rows_shows_its_p95_beside_ours():
    ledger = Ledger(_chats(301.0, [2.0] * 10))
    result = SurgeResult(PLAN, _samples("09:05", "09:10"), ledger, None, 900.0)
    at_0905, at_0910 = result.rows(every_step=True)
    assert (at_0905["interactive_p95"], at_0905["field_p95"]) == ("2.00s", "1.31s")
    assert at_0910["field_p95"] == ""  # 09:10 is not one of the report's rows
    assert "field_p95" in COLUMNS and "field_p95" in UPLOAD_COLUMNS


def test_a_window_shows_the_clients_own_lag_and_the_machines_stalls_that_fell_in_it():
    result = SurgeResult(PLAN, _samples("09:05", "09:10"), Ledger(_chats(301.0, [2.0] * 10)), None, 900.0)
    at_0905 = PLAN.since_start("09:05")
    result.client_lags = [(at_0905 - 10.0, 7.0), (at_0905 - 5.0, 41.0)]
    result.stalls = [(at_0905 + 60.0, 250.0)]
    first, second = result.rows(every_step=True)
    assert (first["client_lag"], first["machine_stalls"]) == ("2, longest 41 ms", "0")
    assert (second["client_lag"], second["machine_stalls"]) == ("<5 ms", "250 ms")


def test_the_batchs_http_requests_are_made_whole_before_the_replay_and_carry_the_same_bodies_as_the_upload():
    from bench.surge.traffic import batch_payloads

    payloads = batch_payloads(PLAN, "http://127.0.0.1:9", "sk-finance")
    bodies = list(batch_bodies(PLAN, Prompts(PLAN.seed)))
    assert len(payloads) == len(bodies) == PLAN.batch_count
    for payload, body in zip(payloads, bodies):
        head, _, sent = payload.partition(b"\r\n\r\n")
        assert b"X-Priority-Class: BATCH" in head and b"Authorization: Bearer sk-finance" in head
        assert json.loads(sent) == body and f"Content-Length: {len(sent)}".encode() in head
