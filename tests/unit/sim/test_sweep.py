"""The sweep's changes to a scenario and its section of the report (the runs are benchmarks, not tests)."""

from __future__ import annotations

from pathlib import Path

from scheduling.engine.forecast import DAY_MS
from sim.scenario import scenario_from_dict
from sim.simulate import result, with_queue
from sim.simulation import simulate
from sim.sweep import admission, default_admission
from sim.sweep import report as sweep_report
from tests.unit.sim.conftest import tiny_surge

RAW = {
    "backends": [{"name": "gpu", "models": ["m"], "slots": 32}],
    "tenants": [{"slug": s, "quota_share": q} for s, q in (("a", 0.5), ("b", 0.3), ("c", 0.2))],
    "generators": [
        {"kind": "burst", "tenant": "b", "class": "BATCH", "count": 300, "service_ms": {"base_ms": 4000}},
        {"kind": "poisson", "tenant": ["a"], "class": "INTERACTIVE", "service_ms": [600, 1400], "rate_per_s": 1},
    ],
}


def test_changes_scale_slots_and_service_times_and_reshape_tenants():
    assert admission.slots(0.75)(RAW)["backends"][0]["slots"] == 24
    faster = admission.service(0.5)(RAW)["generators"]
    assert faster[0]["service_ms"] == {"base_ms": 2000} and faster[1]["service_ms"] == [300, 700]
    split = admission.split_bursts(RAW)["generators"]
    assert split[0]["tenant"] == ["b", "c", "a"] and split[0]["count"] == 100 and split[1] == RAW["generators"][1]
    assert {t["quota_share"] for t in admission.equal_shares(RAW)["tenants"]} == {0.3333}
    assert RAW["backends"][0]["slots"] == 32  # the original is left alone


def test_the_report_section_goes_before_engine_speed_and_is_replaced_in_place(tmp_path: Path):
    report = tmp_path / "REPORT.md"
    report.write_text("# Report\n\n## `surge`\n\n## Engine speed\n\nrows\n", encoding="utf-8")
    sweep_report.write_report(f"{sweep_report.START}\nfirst\n{sweep_report.END}", report)
    sweep_report.write_report(f"{sweep_report.START}\nsecond\n{sweep_report.END}", report)
    text = report.read_text(encoding="utf-8")
    assert "first" not in text and text.count(sweep_report.START) == 1
    assert text.index("second") < text.index("## Engine speed") and text.endswith("rows\n")


def _classes(**counts: tuple[int, int]) -> dict:
    return {cls: {"admitted": a, "within": w} for cls, (a, w) in counts.items()}


def test_default_admission_figures_count_every_admitted_miss_and_compare_with_depth():
    row = {
        "scenario": "x",
        "seed": 1,
        "default": _classes(BATCH=(1000, 990), INTERACTIVE=(500, 500)),
        "depth": _classes(BATCH=(1400, 1100), INTERACTIVE=(500, 500)),
    }
    f = default_admission.figures(row)
    assert f["precision"] == 1490 / 1500 and f["recall"] == 1490 / 1600
    assert (f["class_recall"], f["class"]) == (990 / 1100, "BATCH")
    worse = {**row, "seed": 2, "default": _classes(BATCH=(1000, 900), INTERACTIVE=(500, 500))}
    summary = default_admission.summary([row, worse])
    assert summary[0]["precision"] == 1400 / 1500 and summary[0]["recall"] == 1400 / 1600  # the minimum over seeds
    found = default_admission.misses([row, worse])
    assert any("precision" in m for m in found) and any("recall" in m for m in found)
    exact = _classes(BATCH=(1100, 1100), INTERACTIVE=(500, 500))  # admits what depth finished in time, all in time
    assert default_admission.misses([{**row, "default": exact}]) == []
    assert "**no**" in default_admission.render({"rows": [row]})


def test_the_field_report_runs_the_example_configuration_with_the_default_admission():
    raw = default_admission.load_raw(default_admission.FIELD_REPORT)
    scenario = scenario_from_dict(raw, base=default_admission.SCENARIOS, seed=1)
    assert scenario.config.queue.admission == "predicted"
    assert {c.name: c.sla_ms for c in scenario.config.classes}["BATCH"] == 1_800_000
    assert sum(b.slots for b in scenario.backends) == 48
    assert default_admission.scenario_names()[0] == default_admission.FIELD_REPORT


def test_starts_count_each_request_finished_within_sla_once_in_the_window_it_started(tmp_path: Path):
    raw, step_ms = tiny_surge(), 60_000
    for queue in ({}, default_admission.DEPTH):
        windows = default_admission.within_by_start(raw, 7, queue, step_ms, base=tmp_path)
        scenario = scenario_from_dict(raw, base=tmp_path, seed=7)
        plain = result(simulate(with_queue(scenario, queue) if queue else scenario, policy="fairgate"))
        assert sum(windows) == plain["totals"]["completed_within_sla"] > 0
        assert len(windows) > 2 and all(count >= 0 for count in windows)
    rows = [{"seed": 7, "default": [5, 3], "depth": [5, 3, 2]}]
    table = default_admission.render_starts("x", rows, step_ms)
    assert "| 2-3 | 0 / 2 |" in table and "| all | 8 / 10 |" in table


def test_previous_day_runs_another_draw_then_the_scenario_in_one_engine_and_notes_day_0(tmp_path: Path):
    previous = scenario_from_dict(tiny_surge(), base=tmp_path, seed=7 + default_admission.PREVIOUS_DAY_SEED)
    scenario = scenario_from_dict(tiny_surge(), base=tmp_path, seed=7)
    assert [r.at_ms for r in previous.requests] != [r.at_ms for r in scenario.requests]  # another day, not the same
    doubled = default_admission.two_days(previous, scenario)
    first = len(previous.requests)
    assert len(doubled.requests) == first + len(scenario.requests)
    assert len({r.id for r in doubled.requests}) == len(doubled.requests)
    assert [r.at_ms - DAY_MS for r in doubled.requests[first:]] == [r.at_ms for r in scenario.requests]
    sim = default_admission._DayOne(previous, scenario)
    sim.run()
    assert sim.day0 is not None and sim.sched.demand is not None
    plain = result(simulate(previous, policy="fairgate"))
    day0_admitted = sum(admitted for admitted, *_ in sim.day0.values())
    assert day0_admitted == sum(c["admitted"] for c in plain["classes"].values())  # day 0 is the previous draw's run
    assert sum(c.arrived for c in sim.classes.values()) == len(doubled.requests)
