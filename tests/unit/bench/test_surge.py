"""The surge replay's pure parts for the run whose batch is uploaded through the Batch API: the
batch file, the batch's counts and failures, /metrics' batch lines, the ratio of the peak window's
p95 to the whole surge's, and the upload run's table and headline. No server, no clock."""

from __future__ import annotations

import json

from bench.surge import SurgePlan
from bench.surge.plan import Prompts
from bench.surge.probe import parse
from bench.surge.replay import drained_at
from bench.surge.report import COLUMNS, P95, UPLOAD_COLUMNS, BatchTally, Sample, SurgeResult, ratio, ratio_text
from bench.surge.traffic import GAVE_UP, OK, Ledger, Outcome, batch_bodies
from bench.surge.upload import ENDPOINT, BatchCounts, batch_jsonl, failure_codes
from bench.surge_compare import first_problem, log_problems, target_line, worker_timing

PLAN = SurgePlan(batch_count=40, time_scale=60)


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
