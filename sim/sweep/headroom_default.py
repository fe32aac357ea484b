"""The headroom-default part of the sweep: every shipped scenario with headroom off and on by default.

Each scenario (``sim/scenarios/*.json`` and the field report's configuration on the ``surge`` trace)
runs per seed with its ``headroom`` section replaced by ``HEADROOM_OFF`` (the default before issue
48) and by ``HeadroomPolicy()`` (what a configuration without the section gets now); ``morning-ramp``
also runs with ``strict``. Reported: each class's within-SLA share (finished within SLA / arrived)
off against on, with the 2-point limit, and the ramp's targets. What it counts: docs/simulator.md.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

from scheduling.engine.model import HEADROOM_OFF, HeadroomPolicy
from sim.metrics import percentile
from sim.scenario import scenario_from_dict
from sim.simulate import result
from sim.simulation import simulate
from sim.sweep.default_admission import SCENARIOS, load_raw, scenario_names
from sim.sweep.headroom import BATCH_COST, P95_MS, P99_MS, ramp_checks

MARKERS = ("<!-- sim.sweep.headroom-default: start -->", "<!-- sim.sweep.headroom-default: end -->")
SHARE_LIMIT = 0.02  # a class's within-SLA share may fall by at most 2 points
RAMP = "morning-ramp"

WAYS = ("off", "on")


def run(name: str, seed: int, way: str) -> dict:
    """One run: ``way`` is ``off`` (HEADROOM_OFF), ``on`` (the default) or ``strict`` (the preset)."""
    scenario = scenario_from_dict(load_raw(name), base=SCENARIOS, seed=seed)
    headroom = HEADROOM_OFF if way == "off" else HeadroomPolicy()
    scenario = replace(scenario, config=replace(scenario.config, headroom=headroom))
    sim = simulate(scenario, policy="strict" if way == "strict" else "fairgate")
    out = result(sim)
    if not out["conservation"]["ok"]:
        raise AssertionError(f"{name} seed {seed} {way}: {out['conservation']['problems']}")
    inter, batch = sim.classes[sim.interactive], sim.classes[sim.batch]
    waits, batch_waits = sorted(inter.waits), sorted(batch.waits)
    return {
        "classes": {
            cls: {"arrived": c.arrived, "within": c.completed_within_sla, "queue_timeout": c.queue_timeout}
            for cls, c in sim.classes.items()
            if c.arrived
        },
        "p95_ms": percentile(waits, 95),
        "p99_ms": percentile(waits, 99),
        "timeouts": inter.queue_timeout,
        "batch_median_ms": percentile(batch_waits, 50),
        "held_slot_s": round(sim.sched.held_slot_ms / 1000, 1),
    }


def _run(job: tuple[str, int, str]) -> dict:
    return run(*job)


def rows(seeds: tuple[int, ...], log: Callable[[str], None], processes: int = 1) -> list[dict]:
    jobs = [(name, seed, way) for name in scenario_names() for seed in seeds for way in WAYS]
    jobs += [(RAMP, seed, "strict") for seed in seeds]
    outs = []
    with multiprocessing.get_context("spawn").Pool(processes) if processes > 1 else nullcontext() as pool:
        done = pool.imap(_run, jobs) if pool is not None else map(_run, jobs)
        for job, out in zip(jobs, done):
            log(f"headroom default: {job[0]} / seed {job[1]} / {job[2]} done")
            outs.append(out)
    return [{"scenario": name, "seed": seed, "way": way, **out} for (name, seed, way), out in zip(jobs, outs)]


def _runs(data: list[dict], name: str, way: str) -> dict[int, dict]:
    return {r["seed"]: r for r in data if r["scenario"] == name and r["way"] == way}


def share_rows(data: list[dict]) -> list[dict]:
    """Per scenario and class: the within-SLA shares off and on per seed, and the worst change."""
    out = []
    for name in dict.fromkeys(r["scenario"] for r in data):
        off, on = _runs(data, name, "off"), _runs(data, name, "on")
        seeds = sorted(off.keys() & on.keys())
        for cls in dict.fromkeys(c for s in seeds for c in off[s]["classes"]):
            pairs = []
            for s in seeds:
                a, b = off[s]["classes"].get(cls), on[s]["classes"].get(cls)
                if a and b:
                    pairs.append((s, a["within"] / a["arrived"], b["within"] / b["arrived"]))
            if pairs:
                worst = min(pairs, key=lambda p: p[2] - p[1])
                out.append({"scenario": name, "class": cls, "pairs": pairs, "worst": worst})
    return out


def ramp_rows(data: list[dict]) -> list[dict]:
    on, strict = _runs(data, RAMP, "on"), _runs(data, RAMP, "strict")
    out = []
    for seed in sorted(on.keys() & strict.keys()):
        r, s = on[seed], strict[seed]
        cost, checks = ramp_checks(r, s)
        out.append({"seed": seed, "on": r, "strict": s, "cost": cost, "checks": checks})
    return out


def misses(data: list[dict]) -> list[str]:
    found = []
    for row in share_rows(data):
        seed, before, after = row["worst"]
        if before - after > SHARE_LIMIT + 1e-12:
            found.append(
                f"`{row['scenario']}` {row['class']}: {before:.1%} -> {after:.1%} within SLA (seed {seed}), "
                f"{(after - before) * 100:+.1f} points"
            )
    for row in ramp_rows(data):
        for check, ok in row["checks"].items():
            if not ok:
                found.append(f"`{RAMP}` seed {row['seed']}: {check}")
    return found


def _share_table(data: list[dict]) -> list[str]:
    lines = [
        "| scenario | class | within SLA off -> **on** (per seed) | worst change | met |",
        "|---|---|---|---:|---|",
    ]
    for row in share_rows(data):
        cells = ", ".join(f"{b:.1%} -> **{a:.1%}**" for _, b, a in row["pairs"])
        seed, before, after = row["worst"]
        met = before - after <= SHARE_LIMIT + 1e-12
        lines.append(
            f"| `{row['scenario']}` | {row['class']} | {cells} | {(after - before) * 100:+.1f} pts (seed {seed}) | "
            f"{'yes' if met else '**no**'} |"
        )
    return lines


def _ramp_table(data: list[dict]) -> list[str]:
    off = _runs(data, RAMP, "off")
    lines = [
        "| seed | interactive p95 ms: strict / off / **on** | p99 ms: strict / off / **on** | "
        "timeouts: strict / off / **on** | BATCH median s: strict / **on** | vs strict | held idle slot-s | met |",
        "|---|---|---|---|---|---:|---:|---|",
    ]
    for row in ramp_rows(data):
        r, s, o = row["on"], row["strict"], off.get(row["seed"], row["on"])
        missed = [k for k, ok in row["checks"].items() if not ok]
        lines.append(
            f"| {row['seed']} | {s['p95_ms']:,} / {o['p95_ms']:,} / **{r['p95_ms']:,}** | "
            f"{s['p99_ms']:,} / {o['p99_ms']:,} / **{r['p99_ms']:,}** | "
            f"{s['timeouts']} / {o['timeouts']} / **{r['timeouts']}** | "
            f"{s['batch_median_ms'] / 1000:,.1f} / **{r['batch_median_ms'] / 1000:,.1f}** | {row['cost']:+.1%} | "
            f"{r['held_slot_s']:,.0f} | {'yes' if not missed else '**no** (' + ', '.join(missed) + ')'} |"
        )
    return lines


def render(data: dict) -> str:
    rows_ = data["rows"]
    seeds = ",".join(str(s) for s in sorted({r["seed"] for r in rows_}))
    found = misses(rows_)
    return "\n".join(
        [
            MARKERS[0],
            "## Headroom on by default, every shipped scenario (`python -m sim.sweep --headroom-default`)",
            "",
            "Written by `python -m sim.sweep --headroom-default --write-report`. Each scenario (and `field-report`, "
            "`config/scheduler.example.yaml` on the `surge` trace) runs at seeds "
            f"{seeds} with its headroom section replaced by `HEADROOM_OFF` (*off*: the default before issue 48, "
            "no holds, no deadline rescue) and by the new default (*on*: what a configuration without the "
            "section gets; `morning-ramp` and `surge` lose their own sections here). Within SLA: finished within "
            "the class's SLA over arrived (a refused request counts as missed). Limit: no class of any scenario "
            f"falls by more than {SHARE_LIMIT * 100:.0f} points at any seed. The bound that makes the default "
            "safe for the lower classes (`deadline_share`) and the runs that chose it: "
            '`docs/decisions/2026-12-07-headroom-on-by-default.md`. The section "Predictive headroom on '
            "`morning-ramp`\" (spread and trade-off, on the ramp's own section) was measured before "
            "`deadline_share` existed and was not rerun.",
            "",
            *_share_table(rows_),
            "",
            f"### `{RAMP}` on the new default, strict side by side",
            "",
            f"Targets: interactive p95 wait <= {P95_MS} ms, p99 <= {P99_MS:,} ms, no interactive `queue_timeout`, "
            f"BATCH median wait at most {BATCH_COST:.0%} above strict's on the same trace and seed.",
            "",
            *_ramp_table(rows_),
            "",
            "Misses: " + ("; ".join(found) if found else "none") + ".",
            MARKERS[1],
        ]
    )
