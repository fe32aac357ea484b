"""`make surge`: the field report's surge replayed live against the `fifo` gateway and Fairgate's.

    python -m bench.surge_compare [--batch-count N] [--time-scale 60] [--policies fifo,fairgate]
                                  [--billing on|off] [--write-report]

Starts one simulated GPU backend (slots and timings scaled with the replay), then for each
policy a gateway of its own (fresh SQLite database, the surge scenario's configuration with
its SLAs divided by the time scale), replays the same event against it from this process
(bench.surge), stops it, and prints both timelines and the headline figures side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.launch import Server, start_gateway, start_sim
from bench.report_gateway import section_write
from bench.surge import SurgePlan, SurgeResult, headline_table, markdown_table, replay
from bench.surge.plan import FIELD_BATCH_COUNT
from bench.surge.replay import run_sync

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "surge.json"
DEFAULT_BATCH_COUNT = 6_200  # half the field event (24 slots): ~3 min per policy at time scale 60
BATCH_TENANT = "finance"
SERVICE_MS_PRIOR = 20_000  # the engine's default, in simulated ms


def gateway_yaml(plan: SurgePlan, policy: str, backend_url: str, slots: int) -> str:
    """The surge scenario's configuration, its times divided by the time scale."""
    scenario = json.loads(SCENARIO.read_text(encoding="utf-8"))
    config = dict(scenario["config"])
    config["policy"] = policy
    config["classes"] = [{**c, "sla_ms": plan.sla_ms(c["sla_ms"])} for c in config["classes"]]
    config["queue"] = {**config["queue"], "service_ms_prior": plan.sla_ms(SERVICE_MS_PRIOR)}
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


def run_policy(plan: SurgePlan, policy: str, sim: Server, var_dir: Path, billing: bool) -> SurgeResult:
    slots = int(plan.backend_options()["slots"])
    gateway = start_gateway(
        var_dir / policy,
        gateway_yaml(plan, policy, sim.url, slots),
        tenant_keys(),
        name=f"gateway-{policy}",
        FAIRGATE_BILLING="1" if billing else "0",
    )
    try:
        keys = dict(gateway.keys)
        batch_key = keys.pop(BATCH_TENANT)
        _log(f"== {policy}: gateway {gateway.url}, backend {sim.url}")
        cpu_before_s = gateway.cpu_s()
        result = run_sync(
            replay(plan, gateway.url, batch_key=batch_key, interactive_keys=list(keys.values()), progress=_log)
        )
        busy = (gateway.cpu_s() - cpu_before_s) / plan.real_s(result.ended_sim_s)
        result.notes.append(f"the gateway process used {busy:.0%} of one core on average")
        return result
    finally:
        gateway.stop()


def compare(plan: SurgePlan, policies: list[str], billing: bool) -> dict[str, SurgeResult]:
    var_dir = Path(tempfile.mkdtemp(prefix="fairgate-surge-"))
    sim = start_sim(var_dir, seed=plan.seed, **plan.backend_options())
    try:
        return {policy: run_policy(plan, policy, sim, var_dir, billing) for policy in policies}
    finally:
        sim.stop()


def render(plan: SurgePlan, results: dict[str, SurgeResult], billing: bool, took_s: float) -> str:
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
        f"connections (at most {plan.max_open_batch:,}). Took {took_s / 60:.1f} min.",
        "",
        headline_table(results),
    ]
    for policy, result in results.items():
        parts += ["", f"### `{policy}`", "", markdown_table(result.rows())]
        parts += [f"\nNote: {note}" for note in result.notes]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.surge_compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-count", type=int, default=DEFAULT_BATCH_COUNT)
    parser.add_argument("--time-scale", type=float, default=60.0)
    parser.add_argument("--policies", default="fifo,fairgate")
    parser.add_argument(
        "--billing",
        choices=("on", "off"),
        default="off",
        help="off by default: on SQLite billing caps the gateway near 100 requests/s (bench.gateway_overhead)",
    )
    parser.add_argument("--max-minutes", type=float, default=300.0, help="simulated minutes before giving up")
    parser.add_argument("--write-report", action="store_true", help="also write the section of bench/REPORT-gateway.md")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop our servers on kill, too
    plan = SurgePlan(batch_count=args.batch_count, time_scale=args.time_scale, max_sim_s=args.max_minutes * 60)
    _log(f"surge comparison, scaled: {plan.describe()}")
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    results = compare(plan, [p.strip() for p in args.policies.split(",") if p.strip()], args.billing == "on")
    text = render(plan, results, args.billing == "on", time.monotonic() - started)
    text += f"\n1-minute load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after (2 cores).\n"
    print(text)
    if args.write_report:
        _log(f"wrote {section_write('surge', text)}")


if __name__ == "__main__":
    main()
