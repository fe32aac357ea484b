"""The default-admission part of the sweep: predicted admission as shipped against the depth rule.

Every shipped scenario, and the field report's own configuration (``config/scheduler.example.yaml``
on the ``surge`` trace: 48 slots, the 12,400 burst, BATCH SLA 30 min), runs twice per seed: as
configured (a scenario without ``queue.admission`` gets the default, ``predicted``) and with
``admission: depth`` and no fast-fail. ``prior_rows`` compares where a class's service prior comes
from; ``start_rows`` counts when each rule's within-SLA requests started. Targets and what each figure
counts: docs/simulator.md, "Default admission".
"""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from scheduling.engine.forecast import DAY_MS
from sim.scenario import Scenario, scenario_from_dict
from sim.simulate import result, with_queue
from sim.simulation import Simulation, simulate

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
FIELD_REPORT = "field-report"  # the example configuration on the surge trace
DEPTH = {"admission": "depth", "fast_fail": False}
PRECISION_TARGET, RECALL_TARGET = 0.995, 0.95
CLASS_MIN = 100  # a class's recall is shown once the depth rule finished this many of it within SLA
MARKERS = ("<!-- sim.sweep.default-admission: start -->", "<!-- sim.sweep.default-admission: end -->")
DAY_MARKERS = (
    "<!-- sim.sweep.default-admission-previous-day: start -->",
    "<!-- sim.sweep.default-admission-previous-day: end -->",
)
PREVIOUS_DAY_SEED = 1000  # day 0 of --previous-day: the same scenario drawn with seed + this
PRIOR_SCENARIOS = (FIELD_REPORT, "surge-30min", "quiet-burst")


def scenario_names() -> list[str]:
    return [FIELD_REPORT, *(p.stem for p in sorted(SCENARIOS.glob("*.json")))]


def load_raw(name: str) -> dict:
    if name == FIELD_REPORT:
        raw = json.loads((SCENARIOS / "surge.json").read_text(encoding="utf-8"))
        return {**raw, "name": FIELD_REPORT, "config": "../../config/scheduler.example.yaml"}
    return json.loads((SCENARIOS / f"{name}.json").read_text(encoding="utf-8"))


def day_shift_ms(scenario: Scenario) -> int:
    """Whole days from the start of ``scenario``'s trace to the next day: one, or as many as its trace spans."""
    last_ms = max((r.at_ms for r in scenario.requests), default=0)
    return (last_ms // DAY_MS + 1) * DAY_MS


def two_days(previous: Scenario, scenario: Scenario) -> Scenario:
    """``previous``'s trace as day 0, then ``scenario``'s ``day_shift_ms(previous)`` later (day 1; a
    trace that already spans days, such as ``morning-ramp``'s two mornings, is shifted past its own
    last day)."""
    shift_ms = day_shift_ms(previous)
    day0 = [replace(r, id=f"day0-{r.id}") for r in previous.requests]
    day1 = [replace(r, at_ms=r.at_ms + shift_ms) for r in scenario.requests]
    horizon_ms = None if scenario.horizon_ms is None else scenario.horizon_ms + shift_ms
    return replace(scenario, requests=day0 + day1, horizon_ms=horizon_ms)


class _DayOne(Simulation):
    """A simulation of ``two_days`` that notes each class's figures as day 1 begins (``day0``)."""

    def __init__(self, previous: Scenario, scenario: Scenario) -> None:
        super().__init__(two_days(previous, scenario), policy="fairgate")
        self.shift_ms = day_shift_ms(previous)
        self.day0: dict[str, tuple[int, int, int, int]] | None = None

    def _before(self, t_ms: int) -> None:
        if self.day0 is None and t_ms >= self.shift_ms:
            if self.flights:
                raise AssertionError("day 0 has requests in flight when day 1 begins")
            self.day0 = {
                name: (c.admitted, c.completed_within_sla, c.queue_timeout, self.fast_failed[name])
                for name, c in self.classes.items()
            }
        super()._before(t_ms)


def run_classes(name: str, seed: int, queue: dict, previous_day: bool = False) -> dict:
    """Per class of one run: admitted, finished within SLA, 504s (of them fast-failed), and the
    engine's mean service time at the end (``service_ms``, the class's measured mean, or None).
    With ``previous_day``: day 1's figures of a run on two days (``two_days``), day 0 the same scenario
    drawn with another seed (``PREVIOUS_DAY_SEED``)."""
    raw = load_raw(name)
    scenario = scenario_from_dict(raw, base=SCENARIOS, seed=seed)
    if queue:
        scenario = with_queue(scenario, queue)
    if previous_day:
        previous = scenario_from_dict(raw, base=SCENARIOS, seed=seed + PREVIOUS_DAY_SEED)
        sim: Simulation = _DayOne(with_queue(previous, queue) if queue else previous, scenario)
        sim.run()
    else:
        sim = simulate(scenario, policy="fairgate")
    out = result(sim)
    if not out["conservation"]["ok"]:
        raise AssertionError(f"{name} seed {seed}: {out['conservation']['problems']}")
    day0 = getattr(sim, "day0", None) or {}
    classes = {}
    for cls, c in out["classes"].items():
        mean = sim.sched._cls_service.get(cls)
        before = day0.get(cls, (0, 0, 0, 0))
        classes[cls] = {
            "admitted": c["admitted"] - before[0],
            "within": c["completed_within_sla"] - before[1],
            "queue_timeout": c["queue_timeout"] - before[2],
            "fast_failed": out["queue_timeouts"][cls]["fast_failed"] - before[3],
            "service_ms": round(mean.mean_ms) if mean is not None and mean.samples else None,
        }
    return classes


class _StartCount(Simulation):
    """A simulation that also counts the requests that started within their SLA, per window of ``step_ms``."""

    def __init__(self, scenario: Scenario, step_ms: int) -> None:
        super().__init__(scenario, policy="fairgate")
        self.step_ms = step_ms
        self.starts: Counter[int] = Counter()

    def on_complete(self, rid: str, t_ms: int) -> None:
        flight = self.flights[rid]
        if flight.dispatched_ms - flight.trace.at_ms <= self.sla_ms[flight.cls]:
            self.starts[flight.dispatched_ms // self.step_ms] += 1
        super().on_complete(rid, t_ms)


def within_by_start(raw: dict, seed: int, queue: dict, step_ms: int, base: Path = SCENARIOS) -> list[int]:
    """Requests of one run finished within their SLA, by the window of ``step_ms`` their start fell in."""
    scenario = scenario_from_dict(raw, base=base, seed=seed)
    sim = _StartCount(with_queue(scenario, queue) if queue else scenario, step_ms)
    sim.run()
    return [sim.starts[i] for i in range(max(sim.starts, default=-1) + 1)]


def start_rows(name: str, seeds: tuple[int, ...], step_ms: int, processes: int = 1) -> list[dict]:
    """Per seed, ``within_by_start`` of ``name`` as configured and with the depth rule."""
    jobs = [(load_raw(name), seed, queue, step_ms) for seed in seeds for queue in ({}, DEPTH)]
    if processes <= 1:
        outs = [within_by_start(*job) for job in jobs]
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            outs = pool.starmap(within_by_start, jobs, chunksize=1)
    return [{"seed": seed, "default": outs[2 * i], "depth": outs[2 * i + 1]} for i, seed in enumerate(seeds)]


def render_starts(name: str, rows: list[dict], step_ms: int) -> str:
    """The windows as rows, each seed's ``default / depth`` as columns."""
    seeds = [r["seed"] for r in rows]
    lines = [
        f"| `{name}`, started in minute | " + " | ".join(f"seed {s}: as configured / depth" for s in seeds) + " |",
        "|---|" + "---:|" * len(seeds),
    ]
    windows = max(len(r["default"]) for r in rows + [{"default": r["depth"]} for r in rows])
    for i in range(windows):
        cells = []
        for r in rows:
            ours, depth = (r[k][i] if i < len(r[k]) else 0 for k in ("default", "depth"))
            cells.append(f"{ours:,} / {depth:,}")
        lo, hi = i * step_ms // 60_000, (i + 1) * step_ms // 60_000
        lines.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    totals = [f"{sum(r['default']):,} / {sum(r['depth']):,}" for r in rows]
    lines.append("| all | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def _pool(jobs: list[tuple], processes: int, log: Callable[[str], None]) -> list[dict]:
    for job in jobs:
        day = " / day 1" if len(job) > 3 and job[3] else ""
        log(f"default admission: {job[0]} / seed {job[1]} / {job[2] or 'as configured'}{day}")
    if processes <= 1:
        return [run_classes(*job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.starmap(run_classes, jobs, chunksize=1)


def precision_recall_rows(
    seeds: tuple[int, ...], log: Callable[[str], None], processes: int = 1, previous_day: bool = False
) -> list[dict]:
    """One row per scenario and seed: the per-class figures as configured and with the depth rule
    (with ``previous_day``: both on day 1, after a day 0 of the same scenario, another seed)."""
    names = scenario_names()
    jobs = [(name, seed, queue, previous_day) for name in names for seed in seeds for queue in ({}, DEPTH)]
    outs = iter(_pool(jobs, processes, log))
    return [
        {"scenario": name, "seed": seed, "default": next(outs), "depth": next(outs)} for name in names for seed in seeds
    ]


def figures(row: dict) -> dict:
    """Precision (every admitted request, a 504 after admission as a miss) and recall against the
    depth rule, over all classes, and the lowest recall of a class with ``CLASS_MIN`` in SLA."""
    ours, depth = row["default"], row["depth"]
    admitted = sum(c["admitted"] for c in ours.values())
    within = sum(c["within"] for c in ours.values())
    depth_within = sum(c["within"] for c in depth.values())
    depth_admitted = sum(c["admitted"] for c in depth.values())
    worst = min(
        ((ours[cls]["within"] / d["within"], cls) for cls, d in depth.items() if d["within"] >= CLASS_MIN),
        default=(1.0, "-"),
    )
    return {
        "precision": within / admitted if admitted else 1.0,
        "recall": within / depth_within if depth_within else 1.0,
        "depth_precision": depth_within / depth_admitted if depth_admitted else 1.0,
        "class_recall": worst[0],
        "class": worst[1],
        "admitted": admitted,
        "within": within,
        "depth_within": depth_within,
    }


def summary(rows: list[dict]) -> list[dict]:
    """Per scenario, the minimum over its seeds of each figure (and the class of the lowest)."""
    by_name: dict[str, list[dict]] = {}
    for row in rows:
        by_name.setdefault(row["scenario"], []).append(figures(row) | {"seed": row["seed"]})
    out = []
    for name, runs in by_name.items():
        worst_class = min(runs, key=lambda f: f["class_recall"])
        out.append(
            {
                "scenario": name,
                "seeds": [f["seed"] for f in runs],
                "precision": min(f["precision"] for f in runs),
                "recall": min(f["recall"] for f in runs),
                "depth_precision": min(f["depth_precision"] for f in runs),
                "class_recall": worst_class["class_recall"],
                "class": worst_class["class"],
                "admitted": [f["admitted"] for f in runs],
                "within": [f["within"] for f in runs],
                "depth_within": [f["depth_within"] for f in runs],
            }
        )
    return out


def misses(rows: list[dict]) -> list[str]:
    found = []
    for s in summary(rows):
        if s["precision"] < PRECISION_TARGET:
            found.append(f"`{s['scenario']}`: precision {s['precision']:.2%} < {PRECISION_TARGET:.1%}")
        if s["recall"] < RECALL_TARGET:
            found.append(f"`{s['scenario']}`: recall {s['recall']:.3f}x < {RECALL_TARGET}x")
    return found


def prior_rows(seeds: tuple[int, ...], log: Callable[[str], None], processes: int = 1) -> list[dict]:
    """Where the prior comes from, on the burst scenarios: the fixed 20 s prior; learnt from the
    class's own service times as they arrive (``prior_weight`` 30, the censored mean); a previous
    day's profile (the prior set to the class's mean measured in a depth run of the same trace);
    other classes' completions on the pool (the prior set to their completion-weighted mean)."""
    base = _pool([(name, seed, DEPTH) for name in PRIOR_SCENARIOS for seed in seeds], processes, log)
    jobs, labels = [], []
    for (name, seed), depth in zip([(n, s) for n in PRIOR_SCENARIOS for s in seeds], base, strict=True):
        burst = "BATCH"
        others = [(c["service_ms"], c["within"]) for cls, c in depth.items() if cls != burst and c["service_ms"]]
        weight = sum(w for _, w in others) or 1
        sources = {
            "fixed prior (20 s)": {"prior_weight": 0, "margin_after_ms": 0},
            "own completions as they arrive (prior_weight 30)": {"prior_weight": 30, "margin_after_ms": 0},
            "previous day's class mean": {"prior_weight": 0, "service_ms_prior": depth[burst]["service_ms"] or 20_000},
            "other classes on the pool": {
                "prior_weight": 0,
                "service_ms_prior": max(1, round(sum(s * w for s, w in others) / weight)),
            },
        }
        for label, queue in sources.items():
            jobs.append((name, seed, {"admission": "predicted", **queue}))
            labels.append((name, seed, label, depth))
    outs = _pool(jobs, processes, log)
    rows = []
    for (name, seed, label, depth), ours, job in zip(labels, outs, jobs, strict=True):
        row = figures({"default": ours, "depth": depth})
        batch = ours["BATCH"]
        rows.append(
            {
                "scenario": name,
                "seed": seed,
                "source": label,
                "prior_ms": job[2].get("service_ms_prior", 20_000),
                "precision": row["precision"],
                "recall": row["recall"],
                "batch_precision": batch["within"] / batch["admitted"] if batch["admitted"] else 1.0,
                "batch_recall": batch["within"] / depth["BATCH"]["within"] if depth["BATCH"]["within"] else 1.0,
            }
        )
    return rows


def render(data: dict) -> str:
    day = bool(data.get("day"))
    lines = [
        DAY_MARKERS[0] if day else MARKERS[0],
        "## Predicted admission as the default, against the depth rule (`python -m sim.sweep --default-admission"
        + (" --previous-day`), on a second day" if day else "`)"),
        "",
        *(
            [
                "Each scenario runs on two days in one engine: day 0 is the scenario drawn with seed + "
                f"{PREVIOUS_DAY_SEED} (the same generators, other arrivals and service times), day 1 the seed "
                "named, on the first whole day after day 0 (`morning-ramp`'s trace holds two mornings, so its "
                "day 1 is two days later). Both rules are measured on day 1 only, so the engine has learned a "
                'previous day like it, not the same one (docs/engine.md, "Foreseen demand").',
                "",
            ]
            if day
            else []
        ),
        f"Written by `python -m sim.sweep --default-admission{' --previous-day' if day else ''} --write-report`. "
        "Each scenario runs as configured "
        "(a scenario without `queue.admission` gets the default, `predicted`) and with `admission: depth` and "
        "no fast-fail, same trace and seed, same run. Precision: of all admitted requests, the share "
        "finished within their class's SLA (a 504 after admission, fast-failed or not, and a client's give-up "
        "count as missed). Recall: requests finished within SLA against the depth rule's. Both are the minimum "
        "over the seeds run. `field-report` is `config/scheduler.example.yaml` on the `surge` trace (48 slots, "
        "12,400 BATCH at 09:00, BATCH SLA 30 min). The lowest class recall (classes with at least "
        f"{CLASS_MIN} finished within SLA under depth) is shown for reading, not a target.",
        "",
        f"| scenario | seeds | precision (target >= {PRECISION_TARGET:.1%}) | recall (target >= {RECALL_TARGET}x) | "
        "admitted / within SLA / depth within SLA | lowest class recall | depth rule's precision | met |",
        "|---|---|---:|---:|---|---|---:|---|",
    ]
    for s in summary(data["rows"]):
        met = s["precision"] >= PRECISION_TARGET and s["recall"] >= RECALL_TARGET
        counts = "; ".join(
            f"{a:,} / {w:,} / {d:,}" for a, w, d in zip(s["admitted"], s["within"], s["depth_within"], strict=True)
        )
        lines.append(
            f"| `{s['scenario']}` | {','.join(map(str, s['seeds']))} | {s['precision']:.2%} | {s['recall']:.3f} | "
            f"{counts} | {s['class_recall']:.3f} ({s['class']}) | {s['depth_precision']:.2%} | "
            f"{'yes' if met else '**no**'} |"
        )
    found = misses(data["rows"])
    lines += ["", "Misses: " + ("; ".join(found) if found else "none") + "."]
    lines += ["", "Why each miss, and the choice of prior: `docs/decisions/2026-12-07-predicted-admission-default.md`."]
    if data.get("prior"):
        lines += [
            "",
            "### Where the service prior comes from",
            "",
            "Predicted admission, BATCH figures (the burst class) and all classes, minimum over seeds "
            f"{','.join(str(s) for s in sorted({r['seed'] for r in data['prior']}))}; the prior for 'previous "
            "day' and 'other classes' is the mean measured in the depth run of the same trace and seed.",
            "",
            "| scenario | prior from | prior ms | BATCH precision | BATCH recall | precision | recall |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in data["prior"]:
            groups.setdefault((r["scenario"], r["source"]), []).append(r)
        for (name, source), runs in groups.items():
            priors = sorted({r["prior_ms"] for r in runs})
            lines.append(
                f"| `{name}` | {source} | {', '.join(f'{p:,}' for p in priors)} | "
                f"{min(r['batch_precision'] for r in runs):.2%} | {min(r['batch_recall'] for r in runs):.3f} | "
                f"{min(r['precision'] for r in runs):.2%} | {min(r['recall'] for r in runs):.3f} |"
            )
    lines.append(DAY_MARKERS[1] if day else MARKERS[1])
    return "\n".join(lines)
