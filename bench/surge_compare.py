"""`make surge`: the field report's surge replayed live against the `fifo` gateway and Fairgate's,
and against Fairgate with the batch uploaded through the Batch API.

    python -m bench.surge_compare [--batch-count 12400] [--time-scale 20] [--baseline-minutes 30]
                                  [--policies fairgate-nobatch,fifo,fairgate,fairgate-upload]
                                  [--billing on|off] [--write-report]

Starts one simulated GPU backend (slots and timings scaled with the replay), then for each
policy a gateway of its own (fresh SQLite database, the surge scenario's configuration with
its SLAs divided by the time scale), replays the same event against it from this process
(bench.surge), stops it, and prints the timelines and the headline figures side by side.

A policy ending in ``-upload`` (``fairgate-upload``) runs that policy's gateway with the same
interactive HTTP traffic, but the finance batch is uploaded once as a JSONL file and started with
``POST /v1/batches`` (bench.surge.upload); the gateway feeds its lines into its engine and a
Celery worker process of the run's own (threads pool, on kombu's file broker under the gateway's
var dir, a queue of its own) runs each granted line.

A policy ending in ``-nobatch`` (``fairgate-nobatch``, run first) is the baseline of issue 15's
ingress target: that policy's gateway, the same chat and near-RT traffic (the same seeds, so the
same arrivals at the same simulated times), no batch at all, from 08:55 to ``--baseline-minutes``
after 09:00 only (the chat traffic is steady, so a stretch long enough for a stable p95 stands for
the whole morning; the batch runs last hours). Every other run's windows are divided by its p95
from 09:00: the target is the worst window at most 1.5x it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.launch import REPO_ROOT, KeptWorker, Server, start_gateway, start_sim
from bench.report_gateway import section_write
from bench.surge import SurgePlan, SurgeResult, headline_table, markdown_table, replay
from bench.surge.plan import FIELD_BATCH_COUNT
from bench.surge.report import P95, p95_of, ratio, ratio_text
from bench.surge.traffic import run_sync
from scheduling.engine.forecast import DAY_MS

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "surge.json"
DEFAULT_BATCH_COUNT = FIELD_BATCH_COUNT  # the field event (48 slots): ~12 min per policy at time scale 20
DEFAULT_TIME_SCALE = 20.0  # at 60 the first real seconds' ~2,000 batch requests saturate one process's intake
BATCH_TENANT = "finance"
SERVICE_MS_PRIOR = 20_000  # the engine's default, in simulated ms
POLICIES = "fairgate-nobatch,fifo,fairgate,fairgate-upload"
UPLOAD = "-upload"  # a policy's run with the batch uploaded through the Batch API
NO_BATCH = "-nobatch"  # a policy's run with the same chat traffic and no batch: the baseline
BASELINE_MINUTES = 30.0  # simulated minutes after 09:00 the no-batch run lasts (~2,500 chats at load 0.5)
WORKER_SPARE = 8  # worker threads beyond the backend's slots (a granted line waits for a free one)
PROBLEMS = ("Traceback", "CRITICAL", "ERROR", "WARNING")  # what a log line that went wrong says
FILE_BROKER = "filesystem://localhost/"  # kombu's file transport under the gateway's var dir: no server
TARGET_RATIO = 2.0  # the issue's: with the job uploaded, peak window p95 <= 2x the whole surge's
BASELINE_TARGET = 1.5  # issue 15 item 4: the worst window's p95 <= 1.5x the no-batch run's
HEADROOM_MIN_BUCKET_MS = 60_000  # the schema's least headroom.bucket_ms (scheduling/engine/schema_headroom.py)
HEADROOM_MIN_RECENT_MS = 1_000  # and its least headroom.recent_ms


def engine_policy(name: str) -> str:
    """The engine preset a run's gateway is configured with (``fairgate-upload`` -> ``fairgate``)."""
    return name.removesuffix(UPLOAD).removesuffix(NO_BATCH)


def scaled_ms(plan: SurgePlan, sim_ms: int, *, at_least: int = 1) -> int:
    """A duration of the simulated day in real milliseconds (0 stays 0: "off"), no less than ``at_least``."""
    return 0 if sim_ms == 0 else max(at_least, plan.sla_ms(sim_ms))


def scaled_bucket_ms(plan: SurgePlan, sim_ms: int) -> int:
    """The headroom profile's bucket in real ms: the smallest the schema takes (it must divide a day
    and be at least a minute) that is no shorter than the scaled one. A compressed replay never sees
    a day twice, so the profile learns only today's earlier buckets (as in the simulator's ``surge``);
    at time scale 20 a bucket is one real minute, 20 simulated ones, of steady chat traffic."""
    bucket = max(HEADROOM_MIN_BUCKET_MS, plan.sla_ms(sim_ms))
    while DAY_MS % bucket:
        bucket += 1
    return bucket


def scaled_headroom(plan: SurgePlan, headroom: dict[str, Any]) -> dict[str, Any]:
    """A ``headroom`` section with its durations divided by the time scale (its counts and shares as
    they are), each kept within what the schema accepts."""
    scaled = dict(headroom)
    for key in ("horizon_ms", "hold_ms", "rescue_ms"):
        if key in scaled:
            scaled[key] = scaled_ms(plan, scaled[key])
    if "recent_ms" in scaled:
        scaled["recent_ms"] = scaled_ms(plan, scaled["recent_ms"], at_least=HEADROOM_MIN_RECENT_MS)
    if "bucket_ms" in scaled:
        scaled["bucket_ms"] = scaled_bucket_ms(plan, scaled["bucket_ms"])
    return scaled


def gateway_yaml(plan: SurgePlan, policy: str, backend_url: str, slots: int) -> str:
    """The surge scenario's configuration, its times divided by the time scale: the classes' SLAs,
    the queue's durations and service prior, and the headroom section's durations."""
    scenario = json.loads(SCENARIO.read_text(encoding="utf-8"))
    config = dict(scenario["config"])
    config["policy"] = policy
    config["classes"] = [{**c, "sla_ms": plan.sla_ms(c["sla_ms"])} for c in config["classes"]]
    queue = {key: scaled_ms(plan, value) if key.endswith("_ms") else value for key, value in config["queue"].items()}
    config["queue"] = {**queue, "service_ms_prior": plan.sla_ms(SERVICE_MS_PRIOR)}
    if "headroom" in config:
        config["headroom"] = scaled_headroom(plan, config["headroom"])
    config["tenants"] = [
        {"slug": t["slug"], "name": t["slug"].title(), "quota_share": t["quota_share"], "annual_budget": 1_000_000_000}
        for t in scenario["tenants"]
    ]
    config["backends"] = [
        {
            "name": "gpu",
            "url": f"{backend_url}/v1",
            "models": [plan.model],
            "slots": slots,
            "input_price_per_1k": 0.002,
            "output_price_per_1k": 0.006,
        }
    ]
    return yaml.safe_dump({"scheduler": config}, sort_keys=False)


def tenant_keys() -> dict[str, tuple[str, str]]:
    tenants = [t["slug"] for t in json.loads(SCENARIO.read_text(encoding="utf-8"))["tenants"]]
    return {slug: (slug, "BATCH" if slug == BATCH_TENANT else "INTERACTIVE") for slug in tenants}


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def log_problems(text: str) -> dict[str, int]:
    """Lines of a process's log that say something went wrong, by kind."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        kind = next((k for k in PROBLEMS if k in line), None)
        if kind is not None:
            found[kind] = found.get(kind, 0) + 1
    return found


def first_problem(text: str) -> str:
    """The first line of a log that says something went wrong; for a traceback, its last line
    (the exception) too."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if "Traceback" in line:
            end = next((later for later in lines[index + 1 :] if later and not later[0].isspace()), "")
            return f"{line.strip()} ... {end.strip()}"
        if any(kind in line for kind in PROBLEMS):
            return line.strip()
    return ""


def _log_note(what: str, text: str) -> str | None:
    problems = log_problems(text)
    if not problems:
        return None
    counts = ", ".join(f"{n:,} {kind}" for kind, n in problems.items())
    first = first_problem(text)[:400]
    return f"{what} has {counts} lines; the first: `{first}`"


def worker_timing(log: str) -> tuple[int, float, float] | None:
    """From a Celery worker's INFO log: the lines it ran, their mean run time (s), and the median
    gap (s) between the moments lines reached it (lines received within 50 ms count as one
    moment): what paces the hand-off from the gateway to the worker."""
    received: list[float] = []
    runs: list[float] = []
    for line in log.splitlines():
        if "batches.run_line[" not in line:
            continue
        if line.endswith("] received"):
            stamp = line[1 : line.index(": ")]
            received.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
        elif "succeeded in " in line:
            runs.append(float(line.split("succeeded in ", 1)[1].split("s", 1)[0]))
    gaps = [later - earlier for earlier, later in zip(received, received[1:]) if later - earlier > 0.05]
    if not runs or not gaps:
        return None
    return len(runs), sum(runs) / len(runs), statistics.median(gaps)


def run_policy(
    plan: SurgePlan, policy: str, sim: Server, var_dir: Path, billing: bool, broker: str = FILE_BROKER
) -> SurgeResult:
    slots = int(plan.backend_options()["slots"])
    upload = policy.endswith(UPLOAD)
    batch = not policy.endswith(NO_BATCH)
    settings = {"FAIRGATE_BILLING": "1" if billing else "0"}
    if upload:  # the gateway hands granted lines to the worker through the broker: not eagerly, in itself
        queue = f"surge-{policy}-{os.getpid()}"  # its own, also on a broker others share
        settings |= {"CELERY_BROKER_URL": broker, "CELERY_TASK_DEFAULT_QUEUE": queue}
    gateway = start_gateway(
        var_dir / policy,
        gateway_yaml(plan, engine_policy(policy), sim.url, slots),
        tenant_keys(),
        name=f"gateway-{policy}",
        **settings,
    )
    worker = None
    try:
        if upload:
            worker = KeptWorker(gateway.env, var_dir / policy, concurrency=slots + WORKER_SPARE)
        keys = dict(gateway.keys)
        batch_key = keys.pop(BATCH_TENANT)
        _log(
            f"== {policy}: gateway {gateway.url}, backend {sim.url}"
            + (", a Celery worker" if worker else "")
            + ("" if batch else f", no batch, until {plan.clock(plan.max_sim_s)}")
        )
        load_before = os.getloadavg()[0]
        cpu_before_s = gateway.cpu_s()
        worker_before_s = worker.cpu_s() if worker else 0.0
        result = run_sync(
            replay(
                plan,
                gateway.url,
                batch_key=batch_key,
                interactive_keys=list(keys.values()),
                progress=_log,
                upload=upload,
                batch=batch,
            )
        )
        real_s = plan.real_s(result.ended_sim_s)
        busy = (gateway.cpu_s() - cpu_before_s) / real_s
        result.notes.append(f"the gateway process used {busy:.0%} of one core on average")
        result.notes.append(
            f"1-minute load average {load_before:.1f} at the run's start, {os.getloadavg()[0]:.1f} at its end "
            f"({os.cpu_count()} cores)"
        )
        if worker is not None:
            result.notes += worker_notes(worker, (worker.cpu_s() - worker_before_s) / real_s)
        logs = [(f"the gateway's log ({gateway.log_path.name})", gateway.log())]
        logs += [(f"the {w.name}'s log ({w.log_path.name})", w.log()) for w in (worker.workers if worker else [])]
        result.notes += [note for what, text in logs if (note := _log_note(what, text))]
        return result
    finally:
        if worker is not None:
            worker.stop()
        gateway.stop()


def worker_notes(worker: KeptWorker, busy: float) -> list[str]:
    """What the worker did: its CPU, its pace, and each time it died and was started again."""
    notes = [
        f"the Celery worker process ({worker.concurrency} threads) used {busy:.0%} of one core on average"
        + (f" (its {worker.restarts + 1} processes together)" if worker.restarts else "")
    ]
    timing = worker_timing(worker.log())
    if timing is not None:
        ran, run_s, gap_s = timing
        notes.append(
            f"the worker ran {ran:,} lines, {run_s:.2f} s real each on average (its log); lines reached it in "
            f"bursts {gap_s:.2f} s real apart (median gap), and a granted line keeps its backend slot from its "
            "grant until the gateway sees it ended"
        )
    if worker.restarts:
        notes.append(
            f"the worker process died {worker.restarts} time(s) and the bench started it again each time (within "
            f"{worker.check_s:g} s, then its start-up), as a process supervisor would; a line whose task died with "
            "it runs again only after the gateway's hand-off lease (FAIRGATE_BATCH_HANDOFF_MS), holding its slot"
        )
    if worker.failed:
        notes.append(f"the worker could not be started again: {worker.failed}")
    return notes


def revision() -> str:
    """The code measured: HEAD's commit, and the product files the working tree changes (not the
    bench, the tests or documents), which the gateways run as they are."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        return done.stdout if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD").strip() or "?"
    changed = sorted(
        line[3:]
        for line in git("status", "--porcelain").splitlines()
        if not line[3:].startswith(("bench/", "tests/")) and not line.endswith(".md")
    )
    if not changed:
        return f"Measured at commit {head}."
    return f"Measured at commit {head} with uncommitted changes in {', '.join(changed)}."


def baseline_plan(plan: SurgePlan, minutes: float) -> SurgePlan:
    """The no-batch run's plan: the same traffic, ending ``minutes`` after 09:00 (on a step)."""
    steps = max(1, round(minutes * 60 / plan.step_sim_s))
    return replace(plan, max_sim_s=min(plan.max_sim_s, plan.warmup_sim_s + steps * plan.step_sim_s))


def with_baseline(results: dict[str, SurgeResult]) -> dict[str, SurgeResult]:
    """Gives every run the no-batch run's p95 from 09:00 (its own too: then its windows' ratios show
    how far a window of the same traffic strays by chance). Unchanged without a no-batch run."""
    base = next((r for r in results.values() if r.no_batch), None)
    if base is not None:
        p95 = p95_of(base.surge_chats())
        for result in results.values():
            result.baseline = p95
    return results


def compare(
    plan: SurgePlan,
    policies: list[str],
    billing: bool,
    broker: str = FILE_BROKER,
    baseline_minutes: float = BASELINE_MINUTES,
) -> dict[str, SurgeResult]:
    var_dir = Path(tempfile.mkdtemp(prefix="fairgate-surge-"))
    sim = start_sim(var_dir, seed=plan.seed, **plan.backend_options())
    short = baseline_plan(plan, baseline_minutes)
    try:
        results = {
            policy: run_policy(short if policy.endswith(NO_BATCH) else plan, policy, sim, var_dir, billing, broker)
            for policy in policies
        }
    finally:
        sim.stop()
    return with_baseline(results)


def render(
    plan: SurgePlan, results: dict[str, SurgeResult], billing: bool, took_s: float, broker: str = FILE_BROKER
) -> str:
    scaled = plan.batch_count / FIELD_BATCH_COUNT
    parts = [
        "## Surge replay, live (`make surge`)",
        "",
        f"Scaled: {plan.describe()}. The event is {scaled:.0%} of the field report's size and runs "
        f"{plan.time_scale:g}x faster than real time; the gateway's SLAs and the backend's timings are divided "
        f"by {plan.time_scale:g}. Times in the tables are simulated (real x {plan.time_scale:g}), so the gateway's "
        f"own per-request overhead also counts {plan.time_scale:g}x (1 ms real = {plan.time_scale / 1000:g} s). "
        f"Billing {'on' if billing else 'off (FAIRGATE_BILLING=0)'}. Chat traffic is streamed; interactive_p95 "
        "is time to first token of the chats sent in the 5 minutes before the row; a user gives up after "
        "20-60 s (`>` marks a p95 that is such a lower bound); in_queue is the gateway's BATCH queue depth "
        "(/metrics); batch_not_sent are batch requests still waiting in the client for one of its open "
        f"connections (at most {plan.max_open_batch:,}). The ratio row is the peak window's p95 over the whole "
        f"surge's (09:00 to the drain). field_p95 is the field report's interactive p95 at its own rows "
        "(the full event in real time, 48 slots; its quiet hours about 0.9 s): our windows are compressed and "
        "carry the gateway's overhead multiplied, so the like-for-like target is vs_no_batch, the same run's "
        "chat traffic without the batch. client_lag is how late the replay's own event loop woke up in the "
        "window, the longest (real ms; from 5 ms, with their count when several): every chat's time to first "
        f"token counts it, {plan.time_scale:g}x; machine_stalls are the machine's own stalls (bench.canary, a "
        "process that only sleeps: 20 ms or more, every process at once). "
        f"Took {took_s / 60:.1f} min. {revision()}",
    ]
    bases = [name for name, result in results.items() if result.no_batch]
    if bases:
        parts += ["", baseline_paragraph(results[bases[0]], bases[0])]
    uploads = [name for name, result in results.items() if result.uploaded]
    if uploads:
        parts += ["", upload_paragraph(plan, uploads, broker)]
    parts += ["", headline_table(results)]
    for name in uploads:
        parts += ["", target_line(name, *results[name].peak_and_whole())]
    for name, result in results.items():
        if not result.no_batch and result.baseline is not None:
            parts += ["", baseline_target_line(name, result.peak_window()[1], result.baseline)]
    for policy, result in results.items():
        every_step = result.no_batch  # a short run: all its windows
        parts += ["", f"### `{policy}`", "", markdown_table(result.rows(every_step), result.columns)]
        parts += [f"\nNote: {note}" for note in result.notes]
    return "\n".join(parts) + "\n"


def baseline_paragraph(base: SurgeResult, name: str) -> str:
    """What the no-batch run is and how its figure is used (said beside the figures)."""
    plan = base.plan
    chats = base.surge_chats()
    return (
        f"`{name}` is the baseline of issue 15's ingress target: the `{engine_policy(name)}` gateway with the "
        f"same chat and near-RT traffic (the same seeds: the same arrivals at the same simulated times) and no "
        f"batch at all, from 08:55 to {plan.clock(plan.max_sim_s)} only; the traffic is steady, so its "
        f"{len(chats):,} chats sent from 09:00 give the baseline p95 ({p95_of(chats).text()}). vs_no_batch is "
        "each window's p95 over it (`>` when the window's p95 is a lower bound: the ratio is at least that); in "
        f"`{name}`'s own table it shows how far a window of the same traffic strays from it by chance. The "
        "target: the worst window's p95 at most "
        f"{BASELINE_TARGET:g}x the baseline's."
    )


def upload_paragraph(plan: SurgePlan, names: list[str], broker: str = FILE_BROKER) -> str:
    """What differs in a run whose batch was uploaded (said beside its figures)."""
    runs = ", ".join(f"`{n}`" for n in names)
    on = "kombu's file broker under the gateway's var dir: no Redis" if broker == FILE_BROKER else f"broker {broker}"
    return (
        f"In {runs} the gateway and the interactive HTTP traffic are the same, but the finance batch is one "
        f"JSONL file of {plan.batch_count:,} lines (the same request bodies) uploaded at 09:00 with the `openai` "
        'SDK (`files.create(purpose="batch")`) and started with `batches.create(completion_window="24h")`. '
        "The gateway feeds the lines into its engine itself (at most FAIRGATE_BATCH_LINES_PER_PROCESS, 64 by "
        "default, at once) and a Celery worker process (threads pool, slots + "
        f"{WORKER_SPARE} threads, {on}, a queue of its own) calls the backend for each granted line, so "
        "the batch's work is partly in another process: the worker's CPU is reported beside the gateway's; a "
        "worker that exits is started again by the bench (said in the notes when it happens). "
        "A line's deadline is the batch's 24 h window (real time: not divided by the time scale), not the "
        "BATCH class's SLA, so aging never lifts batch lines as it does the HTTP batch requests'. "
        "batch_completed is the batch's request_counts (`batches.retrieve`, each row); in_queue is still the "
        "engine's BATCH queue depth (lines fed and waiting in it); batch_pending is fairgate_batch_lines"
        '{state="pending"} from /metrics (lines still in the batch), which the gateway counts every 5 s real '
        f"(= {5 * plan.time_scale / 60:g} simulated minutes), so it can be up to a row old. The batch is polled "
        f"once a step ({plan.step_sim_s / 60:g} simulated minutes), so its drain is known to within a step."
    )


def target_line(name: str, peak: P95, whole: P95) -> str:
    """The issue's target for the uploaded run, met or missed, with the figures."""
    value = ratio(peak, whole)
    if value is None:
        return f"Target (`{name}`): peak window p95 at most {TARGET_RATIO:g}x the whole surge's: not measurable."
    if value > TARGET_RATIO:
        verdict = "missed"
    else:
        verdict = "not shown (the peak is a lower bound)" if peak.censored else "met"
    return (
        f"Target (`{name}`): peak window p95 at most {TARGET_RATIO:g}x the whole surge's: {verdict} "
        f"({peak.text()} / {whole.text()} = {value:.2f}x)."
    )


def baseline_target_line(name: str, peak: P95, base: P95) -> str:
    """Issue 15's ingress target for one run, met or missed: a lower bound above the target is
    missed all the same; one below it shows nothing; a censored baseline makes the ratio an upper
    bound, which shows the target met when it is under it and nothing when over."""
    head = f"Target (`{name}`): worst window p95 at most {BASELINE_TARGET:g}x the no-batch run's"
    value = ratio(peak, base)
    if value is None:
        return f"{head}: not measurable."
    over = value > BASELINE_TARGET
    if peak.censored and base.censored:
        verdict = "not shown (both are lower bounds)"
    elif peak.censored:
        verdict = "missed" if over else "not shown (the window's p95 is a lower bound)"
    elif base.censored:
        verdict = "not shown (the baseline is a lower bound)" if over else "met"
    else:
        verdict = "missed" if over else "met"
    return f"{head}: {verdict} ({peak.text()} / {base.text()} = {ratio_text(peak, base)})."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.surge_compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-count", type=int, default=DEFAULT_BATCH_COUNT)
    parser.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE)
    parser.add_argument(
        "--policies", default=POLICIES, help="comma-separated; a policy ending in -upload sends the batch as a file"
    )
    parser.add_argument(
        "--billing",
        choices=("on", "off"),
        default="off",
        help="off by default: on SQLite billing caps the gateway near 100 requests/s (bench.gateway_overhead)",
    )
    parser.add_argument(
        "--broker",
        default=FILE_BROKER,
        help="Celery broker of the -upload runs (default kombu's file transport; e.g. redis://127.0.0.1:6379/9)",
    )
    parser.add_argument("--max-minutes", type=float, default=300.0, help="simulated minutes before giving up")
    parser.add_argument(
        "--baseline-minutes",
        type=float,
        default=BASELINE_MINUTES,
        help="simulated minutes after 09:00 that the -nobatch run lasts",
    )
    parser.add_argument("--write-report", action="store_true", help="also write the section of bench/REPORT-gateway.md")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop our servers on kill, too
    plan = SurgePlan(batch_count=args.batch_count, time_scale=args.time_scale, max_sim_s=args.max_minutes * 60)
    _log(f"surge comparison, scaled: {plan.describe()}")
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results = compare(plan, policies, args.billing == "on", args.broker, args.baseline_minutes)
    text = render(plan, results, args.billing == "on", time.monotonic() - started, args.broker)
    text += f"\n1-minute load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after (2 cores).\n"
    print(text)
    if args.write_report:
        _log(f"wrote {section_write('surge', text)}")


if __name__ == "__main__":
    main()
