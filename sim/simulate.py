"""Run a scenario through the engine on a virtual clock and print (or save) its metrics.

    python -m sim.simulate SCENARIO.json [--policy NAME] [--seed N] [--json OUT]
                             [--timeline-step-ms N] [--queue KEY=VALUE ...] [--quiet]

``--policy`` names one of the engine's presets; ``--queue`` overrides one key of the config's
``queue`` section (e.g. ``--queue fast_fail=false``). The output: docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from scheduling.engine.model import Policy
from scheduling.engine.schema import config_from_dict, config_to_dict
from sim.metrics import mean, percentile
from sim.scenario import Scenario, load_scenario
from sim.simulation import Simulation, progress_bar, simulate

PROGRESS_MIN_REQUESTS = 20_000


def _small_tenants(sim: Simulation) -> dict:
    slugs = [s for s in sim.scenario.small_tenants if s in sim.tenants]
    waits = [w for s in slugs for w in sim.tenants[s].waits]
    return {
        "tenants": slugs,
        "completed": sum(sim.tenants[s].completed for s in slugs),
        "wait_ms": {"mean": mean(waits), "p95": percentile(sorted(waits), 95)},
    }


def _totals(sim: Simulation) -> dict:
    keys = (
        "arrived",
        "admitted",
        "completed",
        "completed_within_sla",
        "rejected_queue_full",
        "rejected_no_backend",
        "queue_timeout",
        "abandoned",
        "served_after_give_up",
    )
    totals = {k: sum(getattr(c, k) for c in sim.classes.values()) for k in keys}
    arrived, admitted = totals["arrived"] or 1, totals["admitted"] or 1
    totals["downgraded"] = sim.downgraded
    totals["queue_full_ratio"] = round(totals["rejected_queue_full"] / arrived, 5)
    totals["queue_timeout_ratio"] = round(totals["queue_timeout"] / admitted, 5)
    totals["fast_failed"] = sum(sim.fast_failed.values())
    totals["queue_timeout_wait_s"] = round(sum(sim.timeout_wait_ms.values()) / 1000, 1)
    return totals


def _queue_timeouts(sim: Simulation) -> dict:
    """Per class: 504s, how many came early (fast-fail), and the client-seconds spent waiting on them."""
    return {
        name: {
            "count": c.queue_timeout,
            "fast_failed": sim.fast_failed[name],
            "wait_s": round(sim.timeout_wait_ms[name] / 1000, 1),
        }
        for name, c in sim.classes.items()
    }


def conservation_problems(sim: Simulation) -> list[str]:
    """Every arrival is admitted or rejected; every admitted request ends in one terminal state;
    the engine's own counters agree with the simulator's."""
    problems = []
    engine = sim.sched.counters.classes
    for name, c in sim.classes.items():
        if c.arrived != c.admitted + c.rejected_queue_full + c.rejected_no_backend:
            problems.append(f"{name}: arrived {c.arrived} != admitted + rejected")
        if c.admitted != c.completed + c.queue_timeout + c.abandoned:
            problems.append(f"{name}: admitted {c.admitted} != completed + queue_timeout + abandoned")
        tally = engine.get(name)
        pairs = (
            ("enqueued", c.admitted),
            ("completed", c.completed),
            ("queue_timeout", c.queue_timeout),
            ("fast_failed", sim.fast_failed[name]),
            ("cancelled", c.abandoned),
            ("rejected_queue_full", c.rejected_queue_full),
        )
        for field, ours in pairs:
            theirs = getattr(tally, field, 0) if tally is not None else 0
            if theirs != ours:
                problems.append(f"{name}: engine {field} {theirs} != simulator {ours}")
    if sim.in_queue or sim.flights:
        problems.append(f"{sim.in_queue} still waiting, {len(sim.flights)} not terminal at the end")
    return problems


def result(sim: Simulation) -> dict:
    decisions_us = sorted(ns / 1000.0 for ns in sim.decisions_ns)
    problems = conservation_problems(sim)
    return {
        "scenario": sim.scenario.name,
        "policy": sim.policy,
        "seed": sim.scenario.seed,
        "classes": {name: c.as_dict() for name, c in sim.classes.items()},
        "tenants": {slug: t.as_dict() for slug, t in sorted(sim.tenants.items())},
        "small_tenants": _small_tenants(sim),
        "totals": _totals(sim),
        "queue_timeouts": _queue_timeouts(sim),
        "jain_index": sim.jain.index(),
        "jain_samples": len(sim.jain.samples),
        "wasted_service_ratio": round(sim.wasted_ms / sim.slot_ms, 5) if sim.slot_ms else 0.0,
        "goodput_per_s": round(sim.good / (sim.horizon_ms / 1000.0), 4),
        "goodput_requests": sim.good,
        "goodput_window_ms": sim.horizon_ms,
        "end_ms": sim.end_ms,
        "aging": {"boosted": sim.boosted, "preempted": sim.preempted},
        "decision_us": {
            "p50": round(percentile(decisions_us, 50), 2),
            "p99": round(percentile(decisions_us, 99), 2),
            "count": len(decisions_us),
        },
        "timeline": sim.timeline.rows,
        "conservation": {"ok": not problems, "problems": problems},
    }


def with_queue(scenario: Scenario, queue: dict) -> Scenario:
    """``scenario`` with keys of its config's ``queue`` section replaced (validated by the schema)."""
    data = config_to_dict(scenario.config)
    data["queue"] = {**data["queue"], **queue}
    config = replace(config_from_dict(data, source="--queue"), tenants=scenario.tenants, backends=scenario.backends)
    return replace(scenario, config=config)


def run_file(
    path: str | Path,
    *,
    policy: str | None = None,
    seed: int | None = None,
    timeline_step_ms: int | None = None,
    show_progress: bool = False,
    queue: dict | None = None,
) -> dict:
    scenario = load_scenario(path, seed=seed)
    if queue:
        scenario = with_queue(scenario, queue)
    progress = None
    if show_progress and len(scenario.requests) >= PROGRESS_MIN_REQUESTS:
        progress = progress_bar(f"{scenario.name}/{policy or scenario.config.policy.value}")
    sim = simulate(scenario, policy=policy, timeline_step_ms=timeline_step_ms, progress=progress)
    if progress is not None:
        progress(len(scenario.requests), len(scenario.requests), sim.end_ms, True)
        sys.stderr.write("\n")
    return result(sim)


def _summary(out: dict) -> str:
    lines = [f"{out['scenario']} / {out['policy']} (seed {out['seed']})"]
    for name, c in out["classes"].items():
        w = c["wait_ms"]
        lines.append(
            f"  {name:12} arrived {c['arrived']:6}  completed {c['completed']:6}  "
            f"within SLA {c['completed_within_sla']:6}  full {c['rejected_queue_full']:5}  "
            f"timeout {c['queue_timeout']:5}  abandoned {c['abandoned']:5}  "
            f"wait p50/p95 {w['p50'] / 1000:.2f}/{w['p95'] / 1000:.2f} s"
        )
    t = out["totals"]
    lines.append(
        f"  504 queue_timeout {t['queue_timeout']} (of them fast-failed {t['fast_failed']}), "
        f"clients waited {t['queue_timeout_wait_s']:.0f} s on them"
    )
    lines.append(
        f"  jain {out['jain_index']}  wasted {out['wasted_service_ratio']:.2%}  "
        f"goodput {out['goodput_per_s']}/s  preempted {out['aging']['preempted']}  "
        f"decision p99 {out['decision_us']['p99']} us  conservation "
        f"{'ok' if out['conservation']['ok'] else out['conservation']['problems']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("scenario")
    parser.add_argument("--policy", choices=[p.value for p in Policy])
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", dest="json_out", help="write the full result here ('-' for stdout)")
    parser.add_argument("--timeline-step-ms", type=int)
    parser.add_argument("--queue", action="append", default=[], metavar="KEY=VALUE", help="override a queue key")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    queue = {}
    for item in args.queue:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--queue {item!r}: expected KEY=VALUE")
        queue[key.strip()] = yaml.safe_load(value)
    out = run_file(
        args.scenario,
        policy=args.policy,
        seed=args.seed,
        timeline_step_ms=args.timeline_step_ms,
        show_progress=not args.quiet,
        queue=queue,
    )
    if args.json_out == "-":
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(_summary(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
