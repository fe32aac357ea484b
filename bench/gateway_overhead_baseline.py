"""Added latency of this checkout against another one (an earlier commit), side by side in one run.

    git archive HEAD | tar -x -C /tmp/fg-base    # the earlier commit, unpacked
    python -m bench.gateway_overhead_baseline --baseline /tmp/fg-base [--rate 100] [--phase-s 10] [--rounds 2]

Four gateways on one simulated backend (bench.gateway_overhead's world): this checkout's and the
baseline's, each with billing on and off; this checkout's with its access log on
(``FAIRGATE_ACCESS_LOG=1``, or ``--access-log 0``). Each round measures the backend directly, then every gateway, at the
same Poisson rate; added = gateway percentile - direct percentile (bench.gateway_overhead_results.added).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import mean

from bench import gateway_overhead as overhead
from bench import gateway_overhead_results as results
from bench import launch
from bench.surge.traffic import run_sync

NAMES = ("billing on", "billing off", "baseline on", "baseline off")


def _stack(var_dir: Path, baseline: Path, access_log: str) -> overhead.Stack:
    os.environ["FAIRGATE_ACCESS_LOG"] = access_log  # inherited by the gateways (the baseline has none)
    stack = overhead.stack_start(var_dir)
    ours = launch.REPO_ROOT
    try:
        launch.REPO_ROOT = baseline  # the baseline's manage.py, run from its own tree
        for flag in ("1", "0"):
            stack.gateways[f"baseline {'on' if flag == '1' else 'off'}"] = launch.start_gateway(
                var_dir / f"base-{flag}",
                overhead.GATEWAY_YAML.format(url=stack.sim.url),
                {"bench": ("bench", "INTERACTIVE")},
                name=f"baseline-billing-{flag}",
                FAIRGATE_BILLING=flag,
            )
    except BaseException:
        stack.stop()
        raise
    finally:
        launch.REPO_ROOT = ours
    return stack


async def _measure(stack: overhead.Stack, rate: int, phase_s: float, rounds: int) -> dict[str, list]:
    added: dict[str, list] = {name: [] for name in NAMES}
    for index in range(rounds):
        direct = await overhead.phase(stack, "direct", rate, phase_s, seed=index)
        order = NAMES if index % 2 == 0 else tuple(reversed(NAMES))
        for name in order:
            got = await overhead.phase(stack, name, rate, phase_s, seed=index)
            added[name].append(
                (results.added(got, direct, "p50_ms"), results.added(got, direct, "p99_ms"), got.failures)
            )
    return added


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_overhead_baseline", description=__doc__)
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout (its manage.py)")
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--access-log", choices=("0", "1"), default="1", help="this checkout's FAIRGATE_ACCESS_LOG")
    args = parser.parse_args(argv)
    with launch.scratch("fairgate-baseline-") as work:
        stack = _stack(work, args.baseline.resolve(), args.access_log)
        try:
            added = run_sync(_measure(stack, args.rate, args.phase_s, args.rounds))
        finally:
            stack.stop()
    print(f"| gateway at {args.rate}/s | added p50 per round | added p99 per round | mean p50 / p99 | failed |")
    print("|---|---|---|---|---|")
    for name, rows in added.items():
        p50s = [r[0] for r in rows if r[0] is not None]
        p99s = [r[1] for r in rows if r[1] is not None]
        failed = sum(sum(r[2].values()) for r in rows)
        print(
            f"| {name} | {', '.join(f'{v:.1f}' for v in p50s)} ms | {', '.join(f'{v:.1f}' for v in p99s)} ms "
            f"| {mean(p50s):.1f} / {mean(p99s):.1f} ms | {failed} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
