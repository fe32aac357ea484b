"""The ETA part of the sweep: its headline error leaves out promises of 0 kept by an instant start."""

from sim.eta import Promise, calibration
from sim.sweep.eta import summary, table


def _row(errors: dict[str, int], instant: int, in_bound: int) -> dict:
    started = sum(errors.values())
    return {
        "scenario": "s",
        "seed": 1,
        "cls": "BATCH",
        "started": started,
        "prior": 0,
        "blocked": 0,
        "errors": errors,
        "instant": instant,
        "in_bound": in_bound,
    }


def test_instant_starts_are_left_out_of_the_headline_error():
    # 60 promised 0 and started at once (error 0), 40 that waited, missed by 50 %
    s = summary([_row({"0.0": 60, "0.5": 40}, instant=60, in_bound=100)])
    assert s["median_error"] == 0.0 and s["median_error_waited"] == 0.5
    body, misses = table([_row({"0.0": 60, "0.5": 40}, instant=60, in_bound=100)])
    assert "across the sweep: median relative error 50.0% (target ≤ 30 %)" in misses
    assert "`s` BATCH: median relative error 50.0% (target ≤ 30 %)" in misses


def test_a_wait_promised_zero_counts_its_full_error():
    s = summary([_row({"0.0": 10, "1.0": 30}, instant=10, in_bound=10)])
    assert s["median_error_waited"] == 1.0 and s["in_bound"] == 0.25


def test_calibration_reports_the_error_of_the_requests_that_waited():
    promises = [Promise(0, 0, 0, "measured", 0) for _ in range(3)] + [Promise(0, 100, 200, "measured", 200)]
    result = calibration(promises)
    assert result["median_error"] == 0.5 and result["median_error_all"] == 0.0 and result["in_bound"] == 1.0
