"""The ETA part of the sweep: how well the ETA given at admission kept its promise.

Every shipped scenario runs as configured (``fairgate``) through :class:`sim.eta.EtaTraced`; per
class: the share of ``measured`` requests that started by their upper bound, the median of
|start - point| / actual wait, and the share of requests that were not ``measured``. Targets and how
the ETA is made: docs/simulator.md, "ETA calibration".
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sim.eta import ERROR_TARGET, IN_BOUND_TARGET, EtaTraced, instant, relative_error
from sim.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
START, END = "<!-- sim.sweep.eta: start -->", "<!-- sim.sweep.eta: end -->"
MARKERS = (START, END)


def _row(name: str, seed: int) -> list[dict]:
    sim = EtaTraced(load_scenario(SCENARIOS / f"{name}.json", seed=seed), policy="fairgate")
    sim.run()
    by_cls: dict[str, dict] = {}
    for cls, p in sim.promises.values():
        if p.started_ms is None:
            continue
        row = by_cls.setdefault(
            cls,
            {"scenario": name, "seed": seed, "cls": cls, "started": 0, "prior": 0, "blocked": 0},
        )
        row["started"] += 1
        if p.confidence != "measured":
            row[p.confidence] += 1
            continue
        row.setdefault("errors", Counter())[round(relative_error(p), 2)] += 1
        row["instant"] = row.get("instant", 0) + instant(p)
        row["in_bound"] = row.get("in_bound", 0) + (p.started_ms - p.at_ms <= p.upper_ms)
    for row in by_cls.values():  # JSON keys: text
        row["errors"] = {str(k): v for k, v in sorted(row.get("errors", Counter()).items())}
        row.setdefault("in_bound", 0)
        row.setdefault("instant", 0)
    return list(by_cls.values())


def rows(seeds: tuple[int, ...], log: Callable[[str], None], processes: int = 1) -> list[dict]:
    """Every scenario and seed, in that order (in ``processes`` worker processes when more than one)."""
    jobs = [(path.stem, seed) for path in sorted(SCENARIOS.glob("*.json")) for seed in seeds]
    for name, seed in jobs:
        log(f"eta: {name} seed {seed}")
    if processes <= 1:
        parts = [_row(*job) for job in jobs]
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            parts = pool.starmap(_row, jobs, chunksize=1)
    return [row for part in parts for row in part]


def _median(errors: Counter[float]) -> float | None:
    total = sum(errors.values())
    if not total:
        return None
    seen = 0
    for value in sorted(errors):
        seen += errors[value]
        if seen * 2 >= total:
            return value
    return None  # pragma: no cover - the loop always returns


def summary(group: list[dict]) -> dict:
    """One cell of the table: requests started, measured, in bound, the median error."""
    errors: Counter[float] = Counter()
    for r in group:
        errors.update({float(k): v for k, v in r["errors"].items()})
    started = sum(r["started"] for r in group)
    measured = sum(errors.values())
    in_bound = sum(r["in_bound"] for r in group)
    waited = Counter(errors)
    instant = sum(r.get("instant", 0) for r in group)
    waited[0.0] -= instant  # promised 0 and started at once
    return {
        "started": started,
        "measured": measured,
        "waited": measured - instant,
        "not_measured": 1 - measured / started if started else 0.0,
        "in_bound": in_bound / measured if measured else None,
        "median_error": _median(errors),
        "median_error_waited": _median(+waited),
    }


def _verdict(s: dict) -> tuple[bool, bool]:
    """(upper bound met, median error met); the error is that of the requests that waited (a promise
    of 0 kept by an instant start is 0/0, not a measurement)."""
    if not s["measured"]:
        return True, True
    error = s["median_error_waited"]
    return s["in_bound"] >= IN_BOUND_TARGET, error is None or error <= ERROR_TARGET


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def table(data: list[dict]) -> tuple[str, list[str]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in data:
        groups.setdefault((r["scenario"], r["cls"]), []).append(r)
    lines = [
        "| scenario | class | started | not `measured` | `measured`: started by the upper bound (≥ 90 %) | "
        "`measured` that waited | median \\|start − point\\| / wait, of those (≤ 30 %) | "
        "the same, with instant starts | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    misses = []
    for (name, cls), group in groups.items():
        s = summary(group)
        bound_ok, error_ok = _verdict(s)
        if not bound_ok:
            misses.append(f"`{name}` {cls}: {_pct(s['in_bound'])} started by the upper bound (target ≥ 90 %)")
        if not error_ok:
            misses.append(f"`{name}` {cls}: median relative error {_pct(s['median_error_waited'])} (target ≤ 30 %)")
        met = "yes" if bound_ok and error_ok else "**no**"
        lines.append(
            f"| `{name}` | {cls} | {s['started']:,} | {_pct(s['not_measured'])} | {_pct(s['in_bound'])} | "
            f"{s['waited']:,} | {_pct(s['median_error_waited'])} | {_pct(s['median_error'])} | {met} |"
        )
    s = summary(data)
    bound_ok, error_ok = _verdict(s)
    lines.append(
        f"| **the sweep** | all | {s['started']:,} | {_pct(s['not_measured'])} | **{_pct(s['in_bound'])}** | "
        f"{s['waited']:,} | **{_pct(s['median_error_waited'])}** | {_pct(s['median_error'])} | "
        f"{'yes' if bound_ok and error_ok else '**no**'} |"
    )
    if not error_ok:
        misses.insert(0, f"across the sweep: median relative error {_pct(s['median_error_waited'])} (target ≤ 30 %)")
    if not bound_ok:
        misses.insert(0, f"across the sweep: {_pct(s['in_bound'])} started by the upper bound (target ≥ 90 %)")
    return "\n".join(lines), misses


def render(data: dict) -> str:
    body, misses = table(data["rows"])
    seeds = sorted({r["seed"] for r in data["rows"]})
    parts = [
        START,
        "## ETA calibration (`python -m sim.sweep --eta`)",
        "",
        "Every shipped scenario as configured, seeds " + ", ".join(map(str, seeds)) + ". The ETA is the one "
        "the engine gave each admitted request right after its admission (its first ETA); a request that "
        "never started (timed out, gave up, fast-failed) is not counted. Relative error: |start − point| / "
        "actual wait, of the `measured` requests that waited: a request promised 0 that started at once is "
        "left out (0/0 is not a measurement; the next column counts it as 0, without a target). Targets on "
        "`measured` requests, across the sweep and per class; the share not `measured` (`prior`: no "
        "completion of its class yet; `blocked`: a higher class held the pool) is reported, without a "
        "target. The upper bound is at most twice the point, always (the engine caps it).",
        "",
        body,
        "",
        "Misses: " + ("none." if not misses else ""),
        *[f"- {m}" for m in misses],
        "",
        'Why they miss (the method: docs/engine.md, "Position and ETA"; the causes were traced at seed 1 on '
        "the ETA branch, before predicted admission's refusal rules and headroom by default were merged beside "
        "it). Median error, INTERACTIVE and NEAR_RT in every mixed scenario, `small-tenant` NEAR_RT: their "
        "waits are for the next slot to free among 32–90 running requests, nearly memoryless; with every "
        "request's features dumped (ETA branch), no single factor on the model's wait put more than 20–40 % of "
        "such waits within 30 % of the point (46 % on `small-tenant`), so their median error stays at 41–90 %. "
        "Two moved with the merge (seed 1, `EtaTraced` with one setting changed, a one-off script outside the "
        "sweep): `surge-30min` NEAR_RT 73 % with headroom off, as on the ETA branch, 109 % with the default; "
        "`small-tenant` NEAR_RT 34 % on the ETA branch, 44 % merged with headroom off, 42 % with it, 29 % with "
        "`admission: depth` and headroom off: the merged admission code moved it, how was not traced. The "
        "pooled target is met because the long waits (BATCH backlogs) are promised within a few % once "
        "calibrated. Upper bound: `higher-surge` BATCH was promised before a chat campaign no forecast could "
        "see (its slip reason says `higher_class`); `on-off` and `on-off-short-queue` BATCH: a tenant's share "
        "moves each time `onoff` comes back or leaves, after the promise; `surge` NEAR_RT, `aging-storm`, "
        "`higher-surge` INTERACTIVE, `small-tenant` NEAR_RT: next-slot waits again, whose point is where they "
        "are densest and whose bound, capped at twice it, covers 80–90 % of them (`small-tenant` at seed 1: "
        "91.4 % on the ETA branch, 89.4 % merged with headroom off, 87.8 % with it). `quiet-burst` BATCH: "
        "most of its burst is promised before any long BATCH wait has ended, so the point is the model's "
        "uncalibrated wait (1.8× short there), and `rnd`'s 800 take a share of the turns after the promise. "
        "A class with a few hundred waits or fewer (`idle-burst` INTERACTIVE and NEAR_RT, `steady-70`) misses "
        "on requests promised a few ms that started at once (error: the point over 1 ms) or on next-slot "
        "waits.",
        "",
        END,
    ]
    return "\n".join(parts)
