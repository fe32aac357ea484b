"""The headroom sweep's changes, its report section, the ramp generator, and the report keeping marked
sections (the runs themselves are benchmarks, not tests)."""

from __future__ import annotations

from pathlib import Path

from bench import report
from sim.generators import DAY_MS, generate
from sim.sweep import headroom as sim_headroom
from sim.sweep import report as sweep_report

RAW = {
    "config": {"headroom": {"enabled": True, "max_slots": 6}},
    "generators": [{"kind": "burst", "tenant": "b", "class": "BATCH", "count": 3, "service_ms": 10, "repeat": 2}],
}


def test_changes_set_headroom_keys_and_one_morning():
    changed = sim_headroom.headroom(profile_weight=0.0)(RAW)
    assert changed["config"]["headroom"] == {"enabled": True, "max_slots": 6, "profile_weight": 0.0}
    assert sim_headroom.one_morning(RAW)["generators"][0]["repeat"] == 1
    assert RAW["config"]["headroom"] == {"enabled": True, "max_slots": 6}


def test_a_ramp_rises_and_repeat_shifts_by_a_day():
    gen = {"kind": "poisson", "tenant": "a", "class": "INTERACTIVE", "service_ms": 10, "rate_per_s": 0.5}
    ramp = generate({**gen, "rate_end_per_s": 20, "end_ms": 600_000, "repeat": 2}, index=0, seed=1)
    first = [r.at_ms for r in ramp if r.at_ms < DAY_MS]
    assert sum(t < 300_000 for t in first) * 2 < sum(t >= 300_000 for t in first)  # more in the second half
    second = [r.at_ms - DAY_MS for r in ramp if r.at_ms >= DAY_MS]
    assert second and all(0 <= t < 600_000 for t in second)
    assert len({r.id for r in ramp}) == len(ramp)


def row(p95: int, timeouts: int, batch_ms: int) -> dict:
    run = {"p95_ms": p95, "p99_ms": p95 * 2, "timeouts": timeouts, "batch_median_ms": batch_ms}
    run |= {"batch_mean_ms": batch_ms, "batch_admitted": 10, "batch_within": 10, "batch_requests": 10}
    return run | {"held_slot_s": 5.0, "interactive": 100}


def test_verdict_and_render():
    good = {"label": "as shipped", "seed": 1, "strict": row(1400, 9, 1000), "off": row(1300, 70, 1000)}
    good["on"] = row(0, 0, 1050)
    bad = {**good, "seed": 2, "on": row(400, 2, 1200)}
    assert sim_headroom.verdict(good)["met"]
    assert not sim_headroom.verdict(bad)["checks"]["batch cost"] and not sim_headroom.verdict(bad)["checks"]["p95"]
    curve = [{"setting": sim_headroom.CURVE[0], "seed": 1, "strict": good["strict"], "on": good["on"]}]
    text = sim_headroom.render({"spread": [good, bad], "curve": curve})
    assert text.startswith(sim_headroom.START) and text.endswith(sim_headroom.END)
    assert "1/2 (missed: batch cost, p95, timeouts)" in text and "+5.0%" in text


def test_regenerating_the_report_keeps_the_sweeps_sections(tmp_path: Path):
    path = tmp_path / "REPORT.md"
    path.write_text("# Report\n\n## Engine speed\n\nrows\n", encoding="utf-8")
    sweep_report.write_report(f"{sweep_report.START}\nsweep\n{sweep_report.END}", path)
    sweep_report.write_report(f"{sim_headroom.START}\nheadroom\n{sim_headroom.END}", path, markers=sim_headroom.MARKERS)
    fresh = "# Report (new)\n\n## `surge`\n\n## Engine speed\n\nnew rows\n"
    text = report.keep_sections(path.read_text(encoding="utf-8"), fresh)
    assert text.index("## `surge`") < text.index("sweep") < text.index("headroom") < text.index("## Engine speed")
    assert text.startswith("# Report (new)") and text.endswith("new rows\n")
    assert report.keep_sections("nothing marked", fresh) == fresh


def test_the_report_says_where_each_interactive_timeout_came_from():
    on = row(0, 1, 1000) | {
        "timeout_states": [{"t_ms": 86_400_000 + 9_000_000, "need": 10, "holds": 0, "chat_waiting": 9}]
    }
    missed = {"label": "slots x0.75", "seed": 3, "strict": row(1400, 9, 1000), "off": row(1300, 70, 1000), "on": on}
    clean = {**missed, "seed": 1, "on": row(0, 0, 1000) | {"timeout_states": []}}
    notes = sim_headroom.timeout_notes([clean, missed])
    assert notes[2] == "- slots x0.75 / seed 3: 2.50 h: need 10, holds 0, 9 chat waiting"
    assert [line for line in notes if line.startswith("- ")] == [notes[2]]  # the clean run has no line
    assert sim_headroom.timeout_notes([clean]) == []
