"""`python -m bench.surge`: replay the field report's surge against a running gateway with time
compressed; prints its timeline table from live measurements (`make surge` runs it against a
`fifo` gateway, a Fairgate one, and a Fairgate one with the batch uploaded through the Batch API,
side by side: bench.surge_compare)."""

from __future__ import annotations

import argparse
import sys

from bench.surge import SurgePlan, markdown_table, replay
from bench.surge.traffic import run_sync


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.surge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gateway", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--batch-key", required=True, help="API key of the tenant that submits the batch")
    parser.add_argument("--interactive-keys", required=True, help="comma-separated keys of the chat departments")
    parser.add_argument("--batch-count", type=int, default=12_400)
    parser.add_argument("--time-scale", type=float, default=60.0, help="simulated seconds per real second")
    parser.add_argument(
        "--load-scale",
        type=float,
        default=None,
        help="size of the event relative to the field report (default: batch-count / 12400)",
    )
    parser.add_argument("--model", default="m")
    parser.add_argument("--max-open-batch", type=int, default=2000, help="open connections of the batch submitter")
    parser.add_argument(
        "--batch-spread-minutes",
        type=float,
        default=2.0,
        help="simulated minutes over which the batch is sent (0: all at once)",
    )
    parser.add_argument("--max-minutes", type=float, default=300.0, help="simulated minutes before giving up")
    parser.add_argument("--every-step", action="store_true", help="a table row every 5 simulated minutes")
    parser.add_argument(
        "--upload",
        action="store_true",
        help="send the batch as one file through the Batch API (the gateway needs a Celery worker on its broker)",
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    o = vars(parser.parse_args(argv))
    keys = [k.strip() for k in o["interactive_keys"].split(",") if k.strip()]
    try:
        plan = SurgePlan(
            batch_count=o["batch_count"],
            time_scale=o["time_scale"],
            load_scale=o["load_scale"],
            model=o["model"],
            max_open_batch=o["max_open_batch"],
            batch_spread_sim_s=o["batch_spread_minutes"] * 60,
            max_sim_s=o["max_minutes"] * 60,
            seed=o["seed"],
        )
        if not keys:
            raise ValueError("--interactive-keys names no key")
    except ValueError as err:
        parser.error(str(err))
    print(f"surge replay: {plan.describe()}", file=sys.stderr)
    print(
        "the gateway's backend and SLAs must be scaled the same way; "
        f"backend: python -m simbackend {_flags(plan.backend_options())}",
        file=sys.stderr,
    )
    result = run_sync(
        replay(
            plan,
            o["gateway"],
            batch_key=o["batch_key"],
            interactive_keys=keys,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            upload=o["upload"],
        )
    )
    print(markdown_table(result.rows(every_step=o["every_step"]), result.columns))
    print()
    for label, value in result.headline().items():
        print(f"{label}: {value}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


def _flags(options: dict) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in options.items())


if __name__ == "__main__":
    sys.exit(main())
