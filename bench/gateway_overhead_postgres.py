"""The PostgreSQL mode of bench.gateway_overhead (``--database postgres``): the scratch databases,
what every process of a gateway used during a run and what the billing worker's transactions
waited on; bench.gateway_overhead_postgres_report renders them (bench/REPORT-gateway-postgres.md;
the SQLite section of bench/REPORT-gateway.md is left as it is).

* ``Scratch``: one database per gateway, ``fg_bench_overhead_<pid>_<billing flag>``, created
  on the server of ``--postgres-url`` and dropped (WITH FORCE) when the stack stops.
* ``Meter``: snapshots of one gateway before and after a run: the CPU of its own process, of its
  children (the billing worker), of the PostgreSQL backends serving its database, of the whole
  machine (/proc/stat), the commits of its database (pg_stat_database), and the Booker's
  histograms from its /metrics (``fairgate_billing_batch_seconds``, ``fairgate_billing_batch_asks``).
* ``WaitSampler``: a process of its own (``python -m bench.gateway_overhead_postgres sample``)
  reading ``pg_stat_activity`` of one database every few ms during a closed-loop run, each
  backend attributed to the OS process at the other end of its socket (the gateway or its billing
  worker): the share of the run the worker's backend was idle (no transaction: waiting for a
  batch), idle in a transaction (waiting for the worker's next statement), running a statement,
  flushing WAL at commit (IO:WALSync/WALWrite) or waiting for a lock (Lock:*).

Nothing here imports Django; psycopg only (the gateway's driver).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SERVER_URL = "postgres://postgres@127.0.0.1:5432"
SECRET_KEY = "fairgate-bench-gateway-overhead-scratch-only"  # the settings require one with DATABASE_URL set
SAMPLE_INTERVAL_MS = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- scratch databases -----------------------------------------------------------------------------


def _connect(server: str, dbname: str = "postgres"):
    import psycopg

    return psycopg.connect(f"{server}/{dbname}", autocommit=True, connect_timeout=10)


@dataclass
class Scratch:
    """Databases this run created (and only it drops)."""

    server: str = SERVER_URL
    names: list[str] = field(default_factory=list)

    def create(self, suffix: str) -> str:
        name = f"fg_bench_overhead_{os.getpid()}_{suffix}"
        with _connect(self.server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return f"{self.server}/{name}"

    def drop(self) -> None:
        with _connect(self.server) as conn:
            while self.names:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.names.pop()}" WITH (FORCE)')


def server_settings(server: str) -> dict[str, str]:
    names = ("server_version", "synchronous_commit", "fsync", "wal_sync_method", "commit_delay", "shared_buffers")
    with _connect(server) as conn:
        rows = conn.execute(
            "SELECT name, setting, COALESCE(unit, '') FROM pg_settings WHERE name = ANY(%s)", [list(names)]
        ).fetchall()
    return {name: f"{setting}{' x ' + unit if unit and unit != 's' else unit}" for name, setting, unit in rows}


# --- what a run used -------------------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _run_wait_s(pid: int) -> float:
    """Seconds the process's main thread has spent runnable but waiting for a CPU (/proc/<pid>/schedstat)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0.0


def worker_niceness(gateway_pid: int) -> int | None:
    """How much nicer than its gateway the gateway's billing worker runs (FAIRGATE_BILLING_WORKER_NICE):
    the most any of its children (the worker, the journal's syncer, which keeps the gateway's) is."""
    children = _children(gateway_pid)
    if not children:
        return None
    mine = os.getpriority(os.PRIO_PROCESS, gateway_pid)
    return max(os.getpriority(os.PRIO_PROCESS, child) for child in children) - mine


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def machine_cpu_s() -> float:
    """CPU seconds all cores spent busy (not idle, not iowait) since boot."""
    parts = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / CLK_TCK


def _metric_sums(text: str) -> dict[str, float]:
    wanted = {}
    for line in text.splitlines():
        if line.startswith(("fairgate_billing_batch_", "fairgate_billing_wait_")):
            name, _, value = line.rpartition(" ")
            wanted[name] = float(value)
    return wanted


@dataclass(frozen=True)
class Snapshot:
    at_s: float
    own_s: float
    children_s: float
    database_s: dict[int, float]  # backend pid -> CPU seconds
    waits_s: dict[str, float]  # "gateway" / "worker" / "database" -> seconds runnable but waiting for a CPU
    database_waits_s: dict[int, float]
    machine_s: float
    commits: int | None
    metrics: dict[str, float]
    ledger_scans: tuple[int, int] = (0, 0)  # sequential scans of the ledger, rows they read (pg_stat_user_tables)


@dataclass(frozen=True)
class Usage:
    """One gateway during one run. Busy shares are of one core (2.0 = both cores of this machine)."""

    seconds: float
    gateway_busy: float  # its own process (the event loop)
    worker_busy: float  # its children: the billing worker
    database_busy: float | None  # the PostgreSQL backends of its database (both its connections)
    machine_busy: float  # every process on the machine: the gateways, the backend, the generator, others
    commits_per_s: float | None
    batches_per_s: float
    asks_per_batch: float | None
    batch_ms: float | None  # mean, from the Booker's send to its answer (gateway.charging)
    batch_ms_buckets: dict[float, int] = field(default_factory=dict)  # upper bound (ms) -> batches in the run
    # the share of the run each was runnable but had no CPU (main threads; schedstat): a process that
    # waits for a core while it has work is slowed by the machine, not by what it waits for
    gateway_cpu_wait: float | None = None
    worker_cpu_wait: float | None = None
    database_cpu_wait: float | None = None
    ledger_seq_scans: int | None = None  # full scans of billing_ledgerentry during the run
    ledger_seq_rows: int | None = None  # rows those scans read
    # answers that waited for billing (fairgate_billing_wait_seconds): for their settlement's journal
    # line before their end, for an early hold still being booked before their first byte
    settlement_waits: int = 0
    settlement_wait_ms: float | None = None  # mean of those waits
    hold_waits: int = 0
    hold_wait_ms: float | None = None

    def batch_quantile_ms(self, q: float) -> float | None:
        """The histogram bucket (upper bound) the q-quantile of the run's batches falls in."""
        total = sum(self.batch_ms_buckets.values())
        if not total:
            return None
        seen = 0
        for bound in sorted(self.batch_ms_buckets):
            seen += self.batch_ms_buckets[bound]
            if seen >= q * total:
                return bound
        return float("inf")


class Meter:
    """Snapshots of one gateway (a bench.launch.Server) and its database (None on SQLite)."""

    def __init__(self, gateway, server: str | None = None, dbname: str | None = None) -> None:
        self.gateway, self.server, self.dbname = gateway, server, dbname
        self._conn = None

    def _query(self, sql: str, params: list, *, own_database: bool = False) -> list[tuple]:
        """One statement on a connection of the meter's own (to the server, or to the gateway's
        database); a connection the server closed meanwhile (a restart) is opened again once."""
        import psycopg

        key = "_own" if own_database else "_conn"
        for attempt in range(2):
            conn = getattr(self, key, None)
            if conn is None or conn.closed:
                conn = _connect(self.server, self.dbname if own_database else "postgres")
                setattr(self, key, conn)
            try:
                return conn.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                conn.close()
                if attempt:
                    raise
        return []

    def _database(self) -> tuple[dict[int, float], int | None, tuple[int, int]]:
        if self.dbname is None:
            return {}, None, (0, 0)
        pids = [
            pid
            for (pid,) in self._query(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'", [self.dbname]
            )
        ]
        commits = self._query("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [self.dbname])[0][0]
        scans = self._query(
            "SELECT COALESCE(seq_scan, 0), COALESCE(seq_tup_read, 0) FROM pg_stat_user_tables "
            "WHERE relname = 'billing_ledgerentry'",
            [],
            own_database=True,
        )
        return {pid: _proc_cpu_s(pid) for pid in pids}, commits, tuple(scans[0]) if scans else (0, 0)

    def analyze(self) -> None:
        """Fresh planner statistics for the gateway's database, as autovacuum keeps them on a
        long-lived one (a scratch ledger grows from empty during the run: with the statistics of
        its first minute the planner reads a batch's ledger entries with a sequential scan)."""
        import psycopg

        if self.dbname is None:
            return
        for attempt in range(2):
            try:
                with _connect(self.server, self.dbname) as conn:
                    conn.execute("ANALYZE")
                return
            except psycopg.OperationalError:
                if attempt:
                    raise

    def _waits(self, backends) -> tuple[dict[str, float], dict[int, float]]:
        pid = self.gateway.process.pid
        waits = {"gateway": _run_wait_s(pid), "worker": sum(_run_wait_s(c) for c in _children(pid))}
        return waits, {b: _run_wait_s(b) for b in backends}

    async def take(self) -> Snapshot:
        try:
            metrics = _metric_sums((await asyncio.to_thread(httpx.get, f"{self.gateway.url}/metrics", timeout=5)).text)
        except httpx.HTTPError:
            metrics = {}
        database, commits, scans = self._database()
        own = self.gateway.own_cpu_s()
        waits, database_waits = self._waits(database)
        return Snapshot(
            time.monotonic(),
            own,
            self.gateway.cpu_s() - own,
            database,
            waits,
            database_waits,
            machine_cpu_s(),
            commits,
            metrics,
            scans,
        )

    async def usage(self, before: Snapshot) -> Usage:
        after = await self.take()
        seconds = after.at_s - before.at_s
        database = None
        if self.dbname is not None:  # a backend that ended meanwhile (a recycled connection) is not counted
            database = sum(cpu - before.database_s.get(pid, 0.0) for pid, cpu in after.database_s.items()) / seconds

        def delta(name: str) -> float:
            return after.metrics.get(name, 0.0) - before.metrics.get(name, 0.0)

        batches = delta("fairgate_billing_batch_seconds_count")
        buckets, below = {}, 0.0
        for name in sorted(
            (n for n in after.metrics if n.startswith("fairgate_billing_batch_seconds_bucket")), key=_bound
        ):
            bound = _bound(name)
            cumulative = delta(name)
            buckets[bound * 1000.0] = int(round(cumulative - below))
            below = cumulative
        waited = {}
        for step in ("settlement", "hold"):
            count = delta(f'fairgate_billing_wait_seconds_count{{step="{step}"}}')
            total_s = delta(f'fairgate_billing_wait_seconds_sum{{step="{step}"}}')
            waited[f"{step}_waits"] = int(round(count))
            waited[f"{step}_wait_ms"] = 1000.0 * total_s / count if count else None
        return Usage(
            seconds=seconds,
            gateway_busy=(after.own_s - before.own_s) / seconds,
            worker_busy=(after.children_s - before.children_s) / seconds,
            database_busy=database,
            machine_busy=(after.machine_s - before.machine_s) / seconds,
            commits_per_s=None
            if after.commits is None or before.commits is None
            else (after.commits - before.commits) / seconds,
            batches_per_s=batches / seconds,
            asks_per_batch=delta("fairgate_billing_batch_asks_sum") / batches if batches else None,
            batch_ms=1000.0 * delta("fairgate_billing_batch_seconds_sum") / batches if batches else None,
            batch_ms_buckets=buckets,
            gateway_cpu_wait=(after.waits_s["gateway"] - before.waits_s["gateway"]) / seconds,
            worker_cpu_wait=(after.waits_s["worker"] - before.waits_s["worker"]) / seconds,
            database_cpu_wait=None
            if self.dbname is None
            else sum(w - before.database_waits_s.get(pid, 0.0) for pid, w in after.database_waits_s.items()) / seconds,
            ledger_seq_scans=None if self.dbname is None else after.ledger_scans[0] - before.ledger_scans[0],
            ledger_seq_rows=None if self.dbname is None else after.ledger_scans[1] - before.ledger_scans[1],
            **waited,
        )

    def close(self) -> None:
        for conn in (self._conn, getattr(self, "_own", None)):
            if conn is not None:
                conn.close()


def _bound(name: str) -> float:
    found = re.search(r'le="([^"]+)"', name)
    return float(found.group(1)) if found else float("inf")


# --- what the billing worker's transactions waited on ------------------------------------------------


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except (FileNotFoundError, PermissionError):
        pass
    return inodes


def _port_inodes() -> dict[int, str]:
    """local TCP port -> socket inode (IPv4 and IPv6)."""
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.split()
            ports[int(parts[1].rsplit(":", 1)[1], 16)] = parts[9]
    return ports


def _state(state: str | None, wait_type: str | None, wait_event: str | None) -> str:
    if state == "active":
        return f"active, waiting {wait_type}:{wait_event}" if wait_type else "active, running"
    return state or "none"


def sample(dbname: str, server: str, owners: dict[str, list[int]], interval_s: float) -> dict[str, dict[str, int]]:
    """Until SIGTERM: label -> state -> samples of the database's backends, and under "cpu_s" label ->
    CPU seconds its backends used from the first sample that saw them to the last."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    labels: dict[int, str] = {}
    counts: dict[str, Counter] = {}
    cpu: dict[int, list[float]] = {}  # backend pid -> [first, last] CPU seconds seen
    started_s = time.monotonic()
    with _connect(server) as conn:
        me = conn.info.backend_pid
        print("ready", flush=True)
        while not stop:
            rows = conn.execute(
                "SELECT pid, client_port, state, wait_event_type, wait_event FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'client backend' AND pid <> %s",
                [dbname, me],
            ).fetchall()
            for pid, port, state, wait_type, wait_event in rows:
                if pid not in labels:
                    inode = _port_inodes().get(port)
                    labels[pid] = next(
                        (label for label, pids in owners.items() if any(inode in _socket_inodes(p) for p in pids)),
                        "other",
                    )
                counts.setdefault(labels[pid], Counter())[_state(state, wait_type, wait_event)] += 1
                seen = _proc_cpu_s(pid)
                cpu.setdefault(pid, [seen, seen])[1] = seen
            counts.setdefault("samples", Counter())["samples"] += 1
            time.sleep(interval_s)
    found: dict = {label: dict(c) for label, c in counts.items()}
    found["cpu_s"] = {}
    for pid, (first, last) in cpu.items():
        found["cpu_s"][labels[pid]] = found["cpu_s"].get(labels[pid], 0.0) + last - first
    found["seconds"] = time.monotonic() - started_s
    return found


class WaitSampler:
    """The sampler process, around one run of one gateway."""

    def __init__(self, server: str, dbname: str, gateway, interval_ms: float = SAMPLE_INTERVAL_MS) -> None:
        children = Path(f"/proc/{gateway.process.pid}/task/{gateway.process.pid}/children").read_text().split()
        owners = {"gateway": [gateway.process.pid], "billing worker": [int(c) for c in children]}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.gateway_overhead_postgres",
                "sample",
                "--db",
                dbname,
                "--server",
                server,
                "--owners",
                json.dumps(owners),
                "--interval-ms",
                str(interval_ms),
            ],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.process.stdout.readline()  # "ready": connected, sampling (or "" if it failed)

    def stop(self) -> dict[str, dict[str, int]]:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=30)
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return {}


# --- the sampler's process ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_overhead_postgres")
    sub = parser.add_subparsers(dest="command", required=True)
    sampler = sub.add_parser("sample", help="sample pg_stat_activity of one database until SIGTERM")
    sampler.add_argument("--db", required=True)
    sampler.add_argument("--server", default=SERVER_URL)
    sampler.add_argument("--owners", default="{}", help='JSON: label -> OS pids, e.g. {"gateway": [123]}')
    sampler.add_argument("--interval-ms", type=float, default=SAMPLE_INTERVAL_MS)
    args = parser.parse_args(argv)
    counts = sample(args.db, args.server, json.loads(args.owners), args.interval_ms / 1000.0)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
