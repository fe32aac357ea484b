"""Faults against the production configuration, and what they cost a client and finance.

    python -m bench.faults [--rounds N] [--requests N] [--only F1,F2] [--db-fault restart|proxy] [--write-report]

The stack (bench.fault_stack): the Procfile's `web` (`manage.py serve`), Celery `worker` and `beat`,
a scratch PostgreSQL database (created and dropped here), a Redis db number of its own
(``--redis-db``), the simulated backend in a process of its own. Production settings: DATABASE_URL,
REDIS_URL, SECRET_KEY, default heartbeat (5 s), dead-after (30 s) and sweep (15 s) intervals.

Each round: ``--requests`` requests over ``--duration-s`` from ``--clients`` openai SDK clients
(bench.fault_load: streamed and not, three tenants with large budgets and one near its limit), the
fault in the middle; the round is counted against the ledger as soon as it has settled (nothing
held, every served request charged), at the latest ``--settle-s`` (60 s) after the fault, and
``manage.py ledger verify`` runs (bench.fault_count). Faults:

* kill-gateway: SIGKILL to `web`, then started again on the same port (as a supervisor would);
* kill-worker: SIGKILL to the gateway's billing worker (its spawned child);
* db-restart: a real restart of the machine's PostgreSQL (``pg_ctlcluster ... restart``), or with
  ``--db-fault proxy`` every production process reaches it through a TCP proxy that is cut for
  ``--db-down-s`` (the shared server is untouched);
* backend-stop: SIGKILL to the simulated backend while streams run, started again on the same port
  after ``--backend-down-s``;
* redis-restart: ``redis-cli shutdown nosave``, then Redis started again as .ci/run starts it;
* price-change: both classes' price factors moved 2x (and back the next round) while requests run.

``--hostile SHARE`` makes that share of the requests hostile (bench.fault_hostile): one id sent twice
at once, prompt lists, long tool definitions, streams the client cuts.

The two real restarts disturb everything else using those servers on the machine; they are put back
as they were (Redis on 6379 with the same settings, PostgreSQL accepting connections).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from bench.fault_count import Count, client_line, finance_line, log_digest, report, round_count, settled, table
from bench.fault_hostile import price_change
from bench.fault_load import Load, plan
from bench.fault_stack import Stack, redis_server, stack_start

REPORT_PATH = Path(__file__).with_name("REPORT-faults.md")
FAULT_NAMES = ("kill-gateway", "kill-worker", "db-restart", "backend-stop", "redis-restart", "price-change")
MIX = {"acme": 0.35, "globex": 0.3, "initech": 0.2}  # and 0.15 for the round's near-limit tenant
NEAR_SHARE, NEAR_BUDGET = 0.15, 3
SIM = dict(slots=32, ttft_ms=20, tokens_per_s=50, seed=1)  # 16-64 tokens: 0.3-1.3 s per answer
YAML = """scheduler:
  classes:
    - {{name: INTERACTIVE, level: 0, sla_ms: 20000, price_factor: 1.6}}
    - {{name: BATCH,       level: 2, sla_ms: 60000, price_factor: 0.7}}
  tenants:
    - {{slug: acme,    name: Acme,    quota_share: 0.35, annual_budget: 100000}}
    - {{slug: globex,  name: Globex,  quota_share: 0.30, annual_budget: 50000}}
    - {{slug: initech, name: Initech, quota_share: 0.20, annual_budget: 20000}}
{near}  backends:
    - {{name: sim, url: "{url}", models: [m], slots: 32, input_price_per_1k: 1, output_price_per_1k: 2}}
"""
REDIS_START = [
    "redis-server",
    "--daemonize",
    "yes",
    "--bind",
    "127.0.0.1",
    "-::1",
    "--port",
    "6379",
    "--save",
    "",
    "--appendonly",
    "no",
    "--dir",
    "/var/lib/redis",
    "--logfile",
    "/var/log/redis/ci.log",
]  # as .ci/run
REDIS_SETTINGS = ("bind", "port", "save", "appendonly", "dir", "logfile", "daemonize")
ABOUT = {  # fault -> (what it does, what finance expects)
    "kill-gateway": (
        "SIGKILL to the gateway process mid-load; the bench starts it again at once on the same port. Clients "
        "in flight lose their connection (a reset, or a stream cut without `[DONE]`); new connections are "
        "refused until the new process is ready.",
        "Holds of the dead process are released as `owner_gone` by a live billing worker or beat's sweep "
        "within dead-after + sweep (30 + 15 s); a served request's settlement was journaled before its last "
        "byte, and the dead gateway's billing worker books its journal before it ends.",
    ),
    "kill-worker": (
        "SIGKILL to the gateway's billing worker (the spawned child) mid-load. Clients should notice nothing "
        "but a short wait.",
        "The gateway starts a new worker and books the lost batch again (idempotent per request id).",
    ),
    "db-restart": (
        "PostgreSQL goes away mid-load and comes back (see the notes for which way). Requests that need a "
        "hold while it is down are refused with 503 service_unavailable.",
        "Every settlement is journaled on disk before the client's last byte; one that cannot be booked is "
        "retried and booked once it is back.",
    ),
    "backend-stop": (
        "SIGKILL to the simulated backend (the only one) while streams run; started again on the same port a few "
        "seconds later. A cut stream ends with an OpenAI-shaped error event, a cut non-streamed request with 502; "
        "after FAIRGATE_CIRCUIT_FAILURES failures the circuit opens for FAIRGATE_CIRCUIT_COOLDOWN_MS (30 s), "
        "and requests get 503 no_backend for that long, also after the backend is back.",
        "A cut stream is charged for what was relayed (not served: no `[DONE]`); failed requests are released.",
    ),
    "price-change": (
        "Both classes' price factors are moved 2x through `manage.py scheduler_config load` mid-load (and "
        "back in the next round). Clients should notice nothing.",
        "Each request is charged at the factor its hold was booked with, never above its hold; nothing else moves.",
    ),
    "redis-restart": (
        "The machine's Redis shut down (nosave, every db emptied) and started again as .ci/run does. Redis "
        "carries the console's channel layer and Celery's broker, not the request path.",
        "Billing does not use Redis: the ledger should be unaffected; beat's sweeps pause until worker and beat "
        "have reconnected.",
    ),
}


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _until(predicate, limit_s: float, step_s: float = 0.2) -> bool:
    deadline_s = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(step_s)
    return True


# --- the faults: each returns what it did ---------------------------------------------------


def kill_gateway(stack: Stack, load: Load, opts) -> str:
    pid = stack.kill("web")
    began = time.monotonic()
    stack.spawn("web")
    return f"killed the gateway (pid {pid}); started again, ready after {time.monotonic() - began:.1f} s"


def kill_worker(stack: Stack, load: Load, opts) -> str:
    pid = stack.billing_worker_pid()
    if pid is None:
        return "no billing worker was running (nothing killed)"
    os.kill(pid, signal.SIGKILL)
    return f"killed the billing worker (pid {pid})"


def db_restart(stack: Stack, load: Load, opts) -> str:
    if opts.db_fault == "proxy":
        stack.proxy.cut()
        time.sleep(opts.db_down_s)
        stack.proxy.restore()
        return f"cut every connection to PostgreSQL through the proxy for {opts.db_down_s:.0f} s"
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    if not _until(_pg_up, 60):
        raise RuntimeError("PostgreSQL did not come back within 60 s")
    return f"restarted PostgreSQL {version} (pg_ctlcluster restart, {time.monotonic() - began:.1f} s)"


def _pg_up() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0


def services_restore(redis_argv_before: list[str] | None) -> None:
    """After a fault that went wrong half-way: the machine's PostgreSQL and Redis running again."""
    if not _pg_up():
        version = sorted(os.listdir("/etc/postgresql"))[-1]
        _log(f"PostgreSQL is down: starting it again ({version} main)")
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"], timeout=120)
        _until(_pg_up, 60)
    if redis_argv_before and _redis("ping").stdout.strip() != "PONG":
        _log(f"Redis is down: starting it again ({' '.join(redis_argv_before)})")
        subprocess.run(redis_argv_before, cwd="/", timeout=30)
        _until(lambda: _redis("ping").stdout.strip() == "PONG", 30)


def backend_stop(stack: Stack, load: Load, opts) -> str:
    _until(lambda: load.streams_open() >= 3, 5, step_s=0.02)
    streams = load.streams_open()
    stack.sim.process.kill()
    stack.sim.process.wait(timeout=10)
    time.sleep(opts.backend_down_s)
    stack.sim_restart()
    return (
        f"killed the backend with {streams} streams open; started again on the same port after "
        f"{opts.backend_down_s:.0f} s"
    )


def _redis(*args: str) -> subprocess.CompletedProcess:
    parts = urlsplit(redis_server())
    return subprocess.run(
        ["redis-cli", "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379), *args],
        capture_output=True,
        text=True,
        timeout=10,
    )


def redis_settings() -> dict[str, str]:
    out = _redis("config", "get", "*").stdout.splitlines()
    pairs = dict(zip(out[::2], out[1::2]))
    return {name: pairs.get(name, "?") for name in REDIS_SETTINGS}


def redis_argv(settings: dict[str, str]) -> list[str]:
    """The command line that starts Redis with ``settings`` again (for 6379: .ci/run's, REDIS_START)."""
    return [
        "redis-server",
        "--daemonize",
        settings["daemonize"],
        "--bind",
        *settings["bind"].split(),
        "--port",
        settings["port"],
        "--save",
        settings["save"],
        "--appendonly",
        settings["appendonly"],
        "--dir",
        settings["dir"],
        "--logfile",
        settings["logfile"],
    ]


def redis_restart(stack: Stack, load: Load, opts) -> str:
    before = redis_settings()
    argv = redis_argv(before)
    if "?" in before.values() or before["daemonize"] != "yes" or before["save"] or before["appendonly"] != "no":
        raise RuntimeError(f"Redis does not run as .ci/run starts it ({before}); not restarting it")
    _redis("shutdown", "nosave")
    _until(lambda: _redis("ping").returncode != 0, 10)
    time.sleep(opts.redis_down_s)
    subprocess.run(argv, check=True, capture_output=True, cwd="/", timeout=30)
    if not _until(lambda: _redis("ping").stdout.strip() == "PONG", 30):
        raise RuntimeError(f"Redis did not come back ({' '.join(argv)})")
    after = redis_settings()
    same = "the same settings" if after == before else f"DIFFERENT settings {after}"
    how = "as .ci/run does" if argv == REDIS_START else f"with `{' '.join(argv)}`"
    return f"shut Redis down (nosave) for {opts.redis_down_s:.0f} s, started it again {how}, with {same}"


FAULTS = {
    "kill-gateway": kill_gateway,
    "kill-worker": kill_worker,
    "db-restart": db_restart,
    "backend-stop": backend_stop,
    "redis-restart": redis_restart,
    "price-change": price_change,
}


# --- a round and a run ----------------------------------------------------------------------


def near_tenants(count: int) -> str:
    """YAML lines of the near-limit tenants (one per round), braces doubled for the later format()."""
    return "".join(
        f"    - {{{{slug: near-{i}, name: Near {i}, quota_share: 0.05, annual_budget: {NEAR_BUDGET}}}}}\n"
        for i in range(count)
    )


def fault_round(stack: Stack, fault: str, index: int, opts) -> Count:
    tag = f"r{index}-{fault}"
    log_from = {name: server.log_path.stat().st_size for name, server in stack.procs.items()}
    asks = plan(tag, opts.requests, {**MIX, f"near-{index}": NEAR_SHARE}, seed=index, hostile_share=opts.hostile)
    load = Load(stack.url, stack.keys, asks, opts.duration_s, clients=opts.clients).start()
    time.sleep(max(0.0, load.started_s + opts.duration_s / 2 - time.monotonic()))
    fault_s = time.monotonic()
    _log(f"[{tag}] fault at {fault_s - load.started_s:.1f} s")
    note = FAULTS[fault](stack, load, opts)
    _log(f"[{tag}] {note}")
    outcomes = load.join()
    gone = stack.supervise()
    served = {o.ask.rid for o in outcomes if o.served}
    in_time = _until(lambda: settled(stack, tag, served), fault_s + opts.settle_s - time.monotonic(), step_s=0.5)
    after_s = time.monotonic() - fault_s
    count = round_count(stack, fault, tag, outcomes)
    count.notes.insert(0, f"Round {index}: {note}.")
    count.notes.append(
        f"Round {index}: the ledger settled {after_s:.1f} s after the fault."
        if in_time
        else f"Round {index}: the ledger had not settled {after_s:.1f} s after the fault (the limit): counted then."
    )
    if gone:
        count.notes.append(
            f"Round {index}: {', '.join(gone)} had exited after the fault; the bench started "
            "it again (as a supervisor would)."
        )
    count.notes.append(f"Round {index}: {failure_window(outcomes, fault_s)}.")
    for name, server in stack.procs.items():
        count.log.update({f"{name}: {line}": n for line, n in log_digest(server.log()[log_from[name] :]).items()})
    for line in (table([count]).splitlines()[-1], client_line(count), finance_line(count), *count.notes):
        _log(f"[{tag}] {line}")
    return count


def failure_window(outcomes: list, fault_s: float) -> str:
    """When the requests that failed (402s aside: the near-limit tenant's, fault or not) ended."""
    failed = sorted(o.ended_s - fault_s for o in outcomes if not o.served and not o.how.startswith("402"))
    if not failed:
        return "no request failed other than by 402"
    return (
        f"{len(failed)} requests failed other than by 402, ending from {failed[0]:+.1f} s to {failed[-1]:+.1f} s "
        "after the fault began"
    )


def run(opts) -> list[Count]:
    """Every fault of ``opts.only`` for ``opts.rounds`` rounds; one Count per fault (rounds summed)."""
    faults = [f for f in opts.only.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise SystemExit(f"unknown fault(s): {', '.join(sorted(unknown))} (known: {', '.join(FAULT_NAMES)})")
    var_dir = Path(opts.var_dir or tempfile.mkdtemp(prefix="fg-faults-"))
    _log(f"logs in {var_dir}")
    rounds = opts.rounds * len(faults)
    keys = {
        name: (name, "BATCH" if name == "globex" else "INTERACTIVE")
        for name in [*MIX, *(f"near-{i}" for i in range(rounds))]
    }
    stack = stack_start(
        var_dir,
        YAML.replace("{near}", near_tenants(rounds)),
        keys,
        redis_db=opts.redis_db,
        db_fault=opts.db_fault,
        sim_options=SIM,
    )
    totals = {fault: Count(fault) for fault in faults}
    redis_before = redis_argv(redis_settings()) if "redis-restart" in faults else None
    try:
        for index in range(rounds):
            fault = faults[index % len(faults)]
            totals[fault].merge(fault_round(stack, fault, index, opts))
    finally:
        services_restore(redis_before)
        stack.stop()
    return list(totals.values())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--rounds", type=int, default=1, help="rounds of every fault (default %(default)s)")
    add("--requests", type=int, default=240, help="requests per round (default %(default)s)")
    add("--duration-s", type=float, default=15.0, help="a round's load spreads over this (default %(default)s)")
    add("--clients", type=int, default=24, help="client threads (default %(default)s)")
    add(
        "--settle-s",
        type=float,
        default=60.0,
        help="count once the ledger settled, at most this long after the fault (default %(default)s)",
    )
    add("--only", default=",".join(FAULT_NAMES), help="comma-separated faults (default: all)")
    add(
        "--db-fault",
        choices=("restart", "proxy"),
        default="restart",
        help="restart the machine's PostgreSQL, or cut a TCP proxy in front of it (default %(default)s)",
    )
    add("--db-down-s", type=float, default=3.0, help="how long the proxy stays cut (default %(default)s)")
    add("--backend-down-s", type=float, default=3.0, help="how long the backend stays down (default %(default)s)")
    add("--redis-down-s", type=float, default=2.0, help="how long Redis stays down (default %(default)s)")
    add("--hostile", type=float, default=0.0, help="share of hostile requests (default %(default)s)")
    add("--redis-db", type=int, default=9, help="the Redis db number of this run (default %(default)s)")
    add("--var-dir", default=None, help="logs and journals here (default: a new temp dir, kept)")
    add("--write-report", action="store_true", help=f"write {REPORT_PATH.name}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    counts = run(opts)
    print(table(counts))
    missed = [c.fault for c in counts if not c.target_met]
    print("targets missed: " + (", ".join(missed) if missed else "none"))
    if opts.write_report:
        settings = (
            f"{opts.requests} requests per round over {opts.duration_s:.0f} s from {opts.clients} openai "
            f"SDK clients (about half streamed; tenants acme/globex/initech with large budgets, one tenant "
            f"with a budget of {NEAR_BUDGET} near its limit); {opts.rounds} round(s) per fault; counted "
            f"once the ledger settled, at most {opts.settle_s:.0f} s after the fault; db fault: {opts.db_fault}; "
            "one simulated backend, "
            f"{SIM['slots']} slots, {SIM['ttft_ms']} ms to the first token, {SIM['tokens_per_s']} tokens/s, "
            "16-64 tokens per answer; production defaults otherwise (heartbeat 5 s, dead after 30 s, "
            "sweep every 15 s, circuit cooldown 30 s)."
            + (f" Hostile requests (bench.fault_hostile): {opts.hostile:.0%} of each round." if opts.hostile else "")
        )
        command = "python -m bench.faults " + " ".join(argv if argv is not None else sys.argv[1:])
        date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        REPORT_PATH.write_text(report(counts, command=command.strip(), date=date, settings=settings, about=ABOUT))
        print(f"wrote {REPORT_PATH}")


if __name__ == "__main__":
    main()
