"""``python -m sim.sweep``: run one part of the sweep and print (or write) its section."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.sweep import admission, default_admission, eta, headroom, headroom_default
from sim.sweep.report import END, REPORT, START, render, write_report

SPEED_SIZES = (1_000, 20_000, 100_000)


def log(line: str) -> None:
    sys.stderr.write(line + "\n")


def admission_data(args: argparse.Namespace) -> dict:
    seeds = (1,) if args.quick else (1, 2, 3, 4, 5)
    if args.json_in:
        data = json.loads(Path(args.json_in).read_text(encoding="utf-8"))
        if args.no_speed:
            data.pop("speed", None)
            data.pop("checks", None)
        return data
    data = {
        "admission": admission.admission_rows(seeds, args.quick, log),
        "fast_fail": admission.fast_fail_rows(seeds, log),
    }
    if not args.no_speed:
        data["speed"] = admission.speed_rows(SPEED_SIZES, 5_000, rounds=5)
        data["checks"] = admission.check_rows(SPEED_SIZES)
    return data


def headroom_data(args: argparse.Namespace) -> dict:
    if args.json_in:
        return json.loads(Path(args.json_in).read_text(encoding="utf-8"))
    seeds = (1,) if args.quick else (1, 2, 3, 4, 5)
    return {
        "spread": headroom.spread_rows(seeds, log, args.jobs),
        "curve": headroom.curve_rows(seeds[:2], log, args.jobs),
    }


def default_admission_data(args: argparse.Namespace) -> dict:
    if args.json_in:
        return json.loads(Path(args.json_in).read_text(encoding="utf-8"))
    seeds = (1,) if args.quick else tuple(args.seeds or (1, 2, 3))
    if args.previous_day:
        return {"rows": default_admission.precision_recall_rows(seeds, log, args.jobs, previous_day=True), "day": 1}
    return {
        "rows": default_admission.precision_recall_rows(seeds, log, args.jobs),
        "prior": default_admission.prior_rows(seeds, log, args.jobs),
    }


def headroom_default_data(args: argparse.Namespace) -> dict:
    if args.json_in:
        return json.loads(Path(args.json_in).read_text(encoding="utf-8"))
    seeds = (1,) if args.quick else tuple(args.seeds or (1, 2, 3))
    return {"rows": headroom_default.rows(seeds, log, args.jobs)}


def eta_data(args: argparse.Namespace) -> dict:
    if args.json_in:
        return json.loads(Path(args.json_in).read_text(encoding="utf-8"))
    return {"rows": eta.rows((1,) if args.quick else (1, 2, 3), log, args.jobs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.sweep", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--headroom", action="store_true", help="the headroom part (headroom cost against strict)")
    parser.add_argument(
        "--default-admission", action="store_true", help="predicted admission as shipped: precision, recall vs depth"
    )
    parser.add_argument(
        "--headroom-default",
        action="store_true",
        help="every scenario with headroom off and on by default: within-SLA share per class, the ramp's targets",
    )
    parser.add_argument(
        "--starts",
        metavar="SCENARIO",
        help="requests started within SLA per 10 minutes, as configured and with the depth rule (prints only)",
    )
    parser.add_argument(
        "--previous-day",
        action="store_true",
        help="default-admission: run each trace as day 0, measure day 1 (the trace a day later)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(s) for s in text.split(",")],
        help="headroom-default, default-admission, starts: seeds",
    )
    parser.add_argument("--eta", action="store_true", help="the ETA part (the ETA's calibration)")
    parser.add_argument("--quick", action="store_true", help="seed 1 only")
    parser.add_argument("--no-speed", action="store_true", help="admission part: leave the engine-speed rows out")
    parser.add_argument(
        "--jobs", type=int, default=1, help="headroom, default-admission, headroom-default, eta, starts: processes"
    )
    parser.add_argument("--write-report", action="store_true")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--from-json", dest="json_in", help="render a saved run instead of running")
    args = parser.parse_args(argv)
    if args.starts:
        step_ms = 600_000
        rows = default_admission.start_rows(args.starts, tuple(args.seeds or (1,)), step_ms, args.jobs)
        print(default_admission.render_starts(args.starts, rows, step_ms))
        return 0
    if args.default_admission:
        data = default_admission_data(args)
        section = default_admission.render(data)
        markers = default_admission.DAY_MARKERS if data.get("day") else default_admission.MARKERS
    elif args.headroom_default:
        data = headroom_default_data(args)
        section, markers = headroom_default.render(data), headroom_default.MARKERS
    elif args.eta:
        data = eta_data(args)
        section, markers = eta.render(data), eta.MARKERS
    elif args.headroom:
        data = headroom_data(args)
        section, markers = headroom.render(data), headroom.MARKERS
    else:
        data = admission_data(args)
        section, markers = render(data), (START, END)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    if args.write_report:
        write_report(section, markers=markers)
        print(f"wrote its section of {REPORT}")
    else:
        print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
