"""The admission part of the sweep: predicted dispatch and early fast-fail beyond their scenarios.

Runs the burst scenarios with prediction and with the depth rule (``admission_rows``), every shipped
scenario with expiry at the deadline and with early fast-fail (``fast_fail_rows``), and
engine_speed's loop by either admission rule (``speed_rows``, ``check_rows``). What each row varies
and the targets: docs/simulator.md.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from scheduling.engine.admission_rules import DepthAdmission
from scheduling.engine.model import Request
from sim import engine_speed
from sim.scenario import scenario_from_dict
from sim.simulate import result, with_queue
from sim.simulation import simulate

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
TARGETS = ("surge-30min", "quiet-burst")
WITHOUT = {"admission": "depth", "fast_fail": False}  # the engine before: depth limit, expiry at the deadline
KNOBS = {"prior_weight": 30, "margin_after_ms": 60_000}  # as the three predicted scenarios ship
PREDICTED = {"admission": "predicted", "fast_fail": True, **KNOBS}
Raw = dict
Change = Callable[[Raw], Raw]


# --- the changes to a scenario ---------------------------------------------------------------


def _scaled(spec: object, factor: float) -> object:
    if isinstance(spec, dict):
        return {k: (v * factor if k in ("base_ms", "per_output_token_ms") else v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [max(1, round(x * factor)) for x in spec]
    return max(1, round(spec * factor)) if isinstance(spec, (int, float)) else spec


def slots(factor: float) -> Change:
    def change(raw: Raw) -> Raw:
        return {**raw, "backends": [{**b, "slots": max(1, round(b["slots"] * factor))} for b in raw["backends"]]}

    return change


def service(factor: float) -> Change:
    def change(raw: Raw) -> Raw:
        gens = [{**g, "service_ms": _scaled(g.get("service_ms"), factor)} for g in raw.get("generators", [])]
        return {**raw, "generators": gens}

    return change


def prior(raw: Raw, service_ms_prior: int) -> Raw:
    """The scenario with ``queue.service_ms_prior`` set (an inline config)."""
    config = raw["config"]
    return {**raw, "config": {**config, "queue": {**config.get("queue", {}), "service_ms_prior": service_ms_prior}}}


def split_bursts(raw: Raw) -> Raw:
    """Each single-tenant burst shared by its tenant and the next two of the tenant list (a third each)."""
    slugs = [t["slug"] for t in raw["tenants"]]
    gens = []
    for g in raw.get("generators", []):
        if g["kind"] == "burst" and isinstance(g["tenant"], str):
            at = slugs.index(g["tenant"])
            g = {**g, "tenant": [slugs[(at + k) % len(slugs)] for k in range(3)], "count": g["count"] // 3}
        gens.append(g)
    return {**raw, "generators": gens}


def equal_shares(raw: Raw) -> Raw:
    share = round(1 / len(raw["tenants"]), 4)
    return {**raw, "tenants": [{**t, "quota_share": share} for t in raw["tenants"]]}


CHANGES: tuple[tuple[str, Change | None], ...] = (
    ("as shipped", None),
    ("slots x0.75", slots(0.75)),
    ("slots x1.5", slots(1.5)),
    ("service x0.8", service(0.8)),
    ("service x1.25", service(1.25)),
    ("service x1.25, prior 25 s", lambda raw: prior(service(1.25)(raw), 25_000)),
    ("bursts over 3 tenants", split_bursts),
    ("equal shares", equal_shares),
)


# --- running ---------------------------------------------------------------------------------


def run(name: str, *, queue: dict, seed: int | None = None, change: Change | None = None) -> dict:
    path = SCENARIOS / f"{name}.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    if change is not None:
        raw = change(raw)
    scenario = with_queue(scenario_from_dict(raw, base=path.parent, seed=seed), queue)
    out = result(simulate(scenario, policy="fairgate"))
    out["burst_classes"] = sorted({g["class"] for g in raw.get("generators", []) if g["kind"] == "burst"})
    return out


def within(out: dict, cls: str) -> float:
    c = out["classes"][cls]
    return c["completed_within_sla"] / c["admitted"] if c["admitted"] else 1.0


def worst_within(out: dict) -> tuple[float, str]:
    return min((within(out, cls), cls) for cls in out["burst_classes"])


def admission_rows(seeds: tuple[int, ...], quick: bool, log: Callable[[str], None]) -> list[dict]:
    rows = []
    for name in (*TARGETS, "idle-burst"):
        for label, change in CHANGES:
            for seed in seeds if label == "as shipped" or quick else seeds[:3]:
                row: dict = {"scenario": name, "change": label, "seed": seed}
                for mode, queue in (("predicted", PREDICTED), ("before", WITHOUT)):
                    log(f"{name} / {label} / seed {seed} / {mode}")
                    out = run(name, queue=queue, seed=seed, change=change)
                    worst, cls = worst_within(out)
                    row[mode] = {
                        "worst_within": worst,
                        "worst_class": cls,
                        "admitted": out["totals"]["admitted"],
                        "completed_within_sla": out["totals"]["completed_within_sla"],
                        "queue_full": out["totals"]["rejected_queue_full"],
                        "queue_timeout": out["totals"]["queue_timeout"],
                        "queue_timeout_wait_s": out["totals"]["queue_timeout_wait_s"],
                    }
                rows.append(row)
    return rows


def fast_fail_rows(seeds: tuple[int, ...], log: Callable[[str], None]) -> list[dict]:
    rows = []
    plans = [(p.stem, None) for p in sorted(SCENARIOS.glob("*.json"))]
    plans += [("higher-surge", seed) for seed in seeds if seed != 1]
    for name, seed in plans:
        configured = json.loads((SCENARIOS / f"{name}.json").read_text(encoding="utf-8"))["config"]
        admissions = (
            ["predicted"] if configured.get("queue", {}).get("admission") == "predicted" else ["depth", "predicted"]
        )
        for admission in admissions:
            row: dict = {"scenario": name, "seed": seed or configured.get("seed", 1), "admission": admission}
            for rule, fast_fail in (("deadline", False), ("early", True)):
                log(f"{name} / seed {seed or 'shipped'} / {admission} / {rule}")
                extra = KNOBS if admission == "predicted" else {}
                out = run(name, queue={"admission": admission, "fast_fail": fast_fail, **extra}, seed=seed)
                t = out["totals"]
                row[rule] = {k: t[k] for k in ("queue_timeout", "fast_failed", "queue_timeout_wait_s")}
                row[rule]["within"] = t["completed_within_sla"] / t["admitted"] if t["admitted"] else 1.0
            rows.append(row)
    return rows


def speed_rows(sizes: tuple[int, ...], pairs: int, rounds: int = 3) -> list[dict]:
    """engine_speed's loop with the depth limit enforced (cap out of reach): depth rule vs prediction."""
    base = engine_speed.bench_config()
    configs = {
        mode: replace(base, queue=replace(base.queue, enforce_depth=True, depth_cap=10**9, admission=mode))
        for mode in ("depth", "predicted")
    }
    original = engine_speed.bench_config
    rows = []
    try:
        for waiting in sizes:
            best: dict[str, dict] = {}
            for round_no in range(rounds):
                order = list(configs.items())
                for mode, config in order if round_no % 2 else order[::-1]:  # alternating, either first; fastest kept
                    engine_speed.bench_config = lambda config=config: config
                    gc.collect()  # the last round's engine (N tickets in cycles) must not be collected in this one
                    m = engine_speed.measure_engine(waiting, pairs, seed=round_no + 1)
                    if mode not in best or m["pair_us"] < best[mode]["pair_us"]:
                        best[mode] = m
            rows.append({"waiting": waiting, **{mode: best[mode] for mode in configs}})
    finally:
        engine_speed.bench_config = original
    return rows


def check_rows(sizes: tuple[int, ...], calls: int = 10_000, rounds: int = 8) -> list[dict]:
    """The admission check alone, depth rule against prediction, on one engine (engine_speed's, N
    waiting, prediction on) for a request of each class, interleaved: the same state for both, so
    the machine's drift between runs does not enter the ratio."""
    base = engine_speed.bench_config()
    config = replace(base, queue=replace(base.queue, enforce_depth=True, depth_cap=10**9, admission="predicted"))
    original, engine_speed.bench_config = engine_speed.bench_config, lambda: config
    rows = []
    try:
        for waiting in sizes:
            work = engine_speed.Workload(1)
            sched, running = engine_speed._engine_at(waiting, work)
            for step in range(200):  # service means and rate windows from some history
                sched.complete(running[step % len(running)], now_ms=step + 1, prompt_tokens=500, output_tokens=200)
                running[step % len(running)] = sched.dispatch(now_ms=step + 1)[0].request.id
            totals = {"depth": 0.0, "predicted": 0.0}
            depth_rule = DepthAdmission(sched)  # the same state under the other rule
            for cls in ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY"):
                book = sched._book(cls, "t01")
                request = Request("x", "t01", cls, "m", 500, 200, 300)
                checks = {
                    "depth": lambda a=depth_rule, r=request, b=book: a.refusal(r, b, 300),
                    "predicted": lambda a=sched.admission, r=request, b=book: a.refusal(r, b, 300),
                }
                best = dict.fromkeys(checks, float("inf"))
                gc.disable()
                try:
                    for round_no in range(rounds):
                        order = list(checks.items())
                        for mode, check in order if round_no % 2 else order[::-1]:
                            started = time.perf_counter_ns()
                            for _ in range(calls):
                                check()
                            best[mode] = min(best[mode], (time.perf_counter_ns() - started) / calls / 1000)
                finally:
                    gc.enable()
                for mode in totals:
                    totals[mode] += best[mode] / 4
            rows.append({"waiting": waiting, **totals})
            gc.collect()
    finally:
        engine_speed.bench_config = original
    return rows
