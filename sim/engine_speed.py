"""Engine cost per enqueue+dispatch pair at a given number of waiting requests, beside heapq.

    python -m sim.engine_speed [--sizes 10,1000,20000,100000] [--pairs 5000] [--json OUT] [--profile]

What one pair is, the baseline and how the rounds are timed: docs/simulator.md, "Engine speed".
``--profile`` runs the loop under ``cProfile`` instead and prints where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import heapq
import io
import json
import pstats
import random
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

from scheduling.engine import Scheduler
from scheduling.engine.model import (
    AgingPolicy,
    AgingSegment,
    BackendSpec,
    Boost,
    ClassSpec,
    QueuePolicy,
    Request,
    SchedulerConfig,
    TenantSpec,
)
from sim.metrics import percentile

SIZES = (10, 1_000, 20_000, 100_000)
SLOTS = 64
TENANTS = tuple(TenantSpec(slug=f"t{i:02d}", quota_share=0.05) for i in range(20))
CLASS_MIX = ("INTERACTIVE", "NEAR_RT", "NEAR_RT", "BATCH", "BATCH", "BATCH", "RETRY")


def bench_config() -> SchedulerConfig:
    hour = 3_600_000
    classes = tuple(
        ClassSpec(name, level, 100 * hour, Decimal("1"))
        for level, name in enumerate(("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY"))
    )
    segments = (
        AgingSegment(0.0, 0.5, Boost.NONE),
        AgingSegment(0.5, 0.8, Boost.LINEAR, 1.0),
        AgingSegment(0.8, 0.95, Boost.QUADRATIC, 2.2),
        AgingSegment(0.95, None, Boost.PREEMPT),
    )
    return SchedulerConfig(
        classes=classes, aging=AgingPolicy("piecewise", segments), queue=replace(QueuePolicy(), enforce_depth=False)
    )


class Workload:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def request(self, now_ms: int) -> Request:
        self.n += 1
        rng = self.rng
        return Request(
            id=f"r{self.n}",
            tenant=rng.choice(TENANTS).slug,
            cls=rng.choice(CLASS_MIX),
            model="m",
            prompt_tokens=rng.randint(100, 4000),
            expected_output_tokens=rng.randint(50, 600),
            enqueued_ms=now_ms,
        )


def _engine_at(waiting: int, work: Workload) -> tuple[Scheduler, list[str]]:
    sched = Scheduler(bench_config(), tenants=TENANTS, backends=[BackendSpec("gpu", ("m",), SLOTS)])
    for _ in range(waiting + SLOTS):
        sched.submit(work.request(0), now_ms=0)
    running = [g.request.id for g in sched.dispatch(now_ms=0)]
    return sched, running


def measure_engine(waiting: int, pairs: int, seed: int = 1, profiler: cProfile.Profile | None = None) -> dict:
    work = Workload(seed)
    sched, running = _engine_at(waiting, work)
    submit_ns, dispatch_ns = [], []
    clock = time.perf_counter_ns
    gc.disable()
    if profiler is not None:
        profiler.enable()  # the measured loop only, not the set-up
    try:
        for step in range(pairs):
            now_ms = step + 1
            request = work.request(now_ms)
            t0 = clock()
            sched.submit(request, now_ms=now_ms)
            t1 = clock()
            sched.complete(running[step % len(running)], now_ms=now_ms, prompt_tokens=500, output_tokens=200)
            t2 = clock()
            grants = sched.dispatch(now_ms=now_ms)
            t3 = clock()
            running[step % len(running)] = grants[0].request.id
            submit_ns.append(t1 - t0)
            dispatch_ns.append(t3 - t2)
    finally:
        if profiler is not None:
            profiler.disable()
        gc.enable()
    decisions = sorted(ns / 1000 for ns in submit_ns + dispatch_ns)
    return {
        "pair_us": (sum(submit_ns) + sum(dispatch_ns)) / pairs / 1000,
        "decision_p50_us": percentile(decisions, 50),
        "decision_p99_us": percentile(decisions, 99),
    }


def measure_heapq(waiting: int, pairs: int, seed: int = 1) -> float:
    rng = random.Random(seed)
    heap = [(rng.random(), i) for i in range(waiting)]
    heapq.heapify(heap)
    push, pop, clock = heapq.heappush, heapq.heappop, time.perf_counter_ns
    gc.disable()
    try:
        started = clock()
        for i in range(pairs):
            push(heap, (rng.random(), i))
            pop(heap)
        elapsed = clock() - started
    finally:
        gc.enable()
    return elapsed / pairs / 1000


def run(sizes: tuple[int, ...] = SIZES, pairs: int = 5_000, rounds: int = 3) -> list[dict]:
    """Engine and heapq alternate ``rounds`` times per size; the fastest round of each is kept
    (as ``timeit`` does: slower rounds measure the machine's other load, not the code)."""
    rows = []
    for waiting in sizes:
        engines, bases = [], []
        for round_no in range(rounds):
            engines.append(measure_engine(waiting, pairs, seed=round_no + 1))
            bases.append(measure_heapq(waiting, pairs, seed=round_no + 1))
        engine = min(engines, key=lambda e: e["pair_us"])
        base_us = min(bases)
        rows.append(
            {
                "waiting": waiting,
                "pairs": pairs,
                "engine_pair_us": round(engine["pair_us"], 2),
                "heapq_pair_us": round(base_us, 3),
                "ratio": round(engine["pair_us"] / base_us, 1),
                "decision_p50_us": round(engine["decision_p50_us"], 2),
                "decision_p99_us": round(engine["decision_p99_us"], 2),
            }
        )
    return rows


def profile(waiting: int, pairs: int, top: int = 30) -> str:
    """cProfile of :func:`measure_engine`'s loop at ``waiting``, sorted by own time."""
    profiler = cProfile.Profile()
    measure_engine(waiting, pairs, profiler=profiler)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return f"## {waiting:,} waiting, {pairs} pairs\n{out.getvalue()}"


def table(rows: list[dict]) -> str:
    lines = [
        "| waiting | engine µs / pair | heapq µs / pair | ratio | decision p50 µs | decision p99 µs |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['waiting']:,} | {r['engine_pair_us']:.2f} | {r['heapq_pair_us']:.3f} | {r['ratio']:.1f}x | "
        f"{r['decision_p50_us']:.2f} | {r['decision_p99_us']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.engine_speed", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--pairs", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each size instead of timing")
    args = parser.parse_args(argv)
    if args.profile:
        for waiting in (int(s) for s in args.sizes.split(",")):
            print(profile(waiting, args.pairs))
        return 0
    rows = run(tuple(int(s) for s in args.sizes.split(",")), args.pairs, args.rounds)
    print(table(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
