"""The headroom-default sweep part: its within-SLA comparison, the ramp's targets and its section
(the runs themselves are benchmarks, not tests)."""

from __future__ import annotations

from bench import report
from sim.sweep import headroom_default as part


def run(name: str, seed: int, way: str, within: dict[str, tuple[int, int]], **ramp: int) -> dict:
    classes = {cls: {"arrived": n, "within": w, "queue_timeout": 0} for cls, (w, n) in within.items()}
    figures = {"p95_ms": 0, "p99_ms": 0, "timeouts": 0, "batch_median_ms": 1000, "held_slot_s": 0.0} | ramp
    return {"scenario": name, "seed": seed, "way": way, "classes": classes, **figures}


def test_a_class_that_loses_more_than_two_points_is_named_and_the_ramp_checked():
    rows = [
        run("steady-90", 1, "off", {"INTERACTIVE": (990, 1000), "BATCH": (1000, 1000)}),
        run("steady-90", 1, "on", {"INTERACTIVE": (1000, 1000), "BATCH": (975, 1000)}),
        run("steady-90", 2, "off", {"INTERACTIVE": (990, 1000), "BATCH": (1000, 1000)}),
        run("steady-90", 2, "on", {"INTERACTIVE": (1000, 1000), "BATCH": (985, 1000)}),
        run(part.RAMP, 1, "off", {"BATCH": (10, 10)}, p95_ms=1400, timeouts=9),
        run(part.RAMP, 1, "on", {"BATCH": (10, 10)}, p95_ms=250, p99_ms=1200, batch_median_ms=1050),
        run(part.RAMP, 1, "strict", {"BATCH": (10, 10)}, p95_ms=1400, batch_median_ms=1000),
    ]
    shares = {(r["scenario"], r["class"]): r for r in part.share_rows(rows)}
    assert shares[("steady-90", "BATCH")]["worst"] == (1, 1.0, 0.975)  # the worse of the two seeds
    assert shares[("steady-90", "INTERACTIVE")]["worst"][0] == 1
    ramp = part.ramp_rows(rows)[0]
    assert round(ramp["cost"], 3) == 0.05 and ramp["checks"] == {
        "p95": True,
        "p99": False,
        "timeouts": True,
        "batch cost": True,
    }
    assert part.misses(rows) == [
        "`steady-90` BATCH: 100.0% -> 97.5% within SLA (seed 1), -2.5 points",
        f"`{part.RAMP}` seed 1: p99",
    ]
    text = part.render({"rows": rows})
    assert text.startswith(part.MARKERS[0]) and text.endswith(part.MARKERS[1])
    assert "| `steady-90` | BATCH | 100.0% -> **97.5%**, 100.0% -> **98.5%** | -2.5 pts (seed 1) | **no** |" in text
    assert "| `steady-90` | INTERACTIVE |" in text and "+1.0 pts (seed 1) | yes |" in text
    assert "**no** (p99)" in text and "Misses: `steady-90` BATCH" in text


def test_a_drop_of_two_points_exactly_is_within_the_limit():
    rows = [
        run("surge", 1, "off", {"BATCH": (1000, 1000)}),
        run("surge", 1, "on", {"BATCH": (980, 1000)}),
    ]
    assert part.misses(rows) == []
    assert "Misses: none." in part.render({"rows": rows})


def test_regenerating_the_report_keeps_the_section():
    start, end = part.MARKERS
    old = f"# Report\n\n{start}\nheadroom default\n{end}\n\n## Engine speed\n"
    text = report.keep_sections(old, "# Report (new)\n\n## Engine speed\n\nrows\n")
    assert f"{start}\nheadroom default\n{end}" in text and text.index(start) < text.index("## Engine speed")
