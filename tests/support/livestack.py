"""A real Fairgate for live tests: `manage.py serve` in a subprocess on a database of its own
(a temp SQLite file, or a fresh PostgreSQL database when DATABASE_URL points at PostgreSQL),
configured from a YAML written by the test, with simulated backends in threads of the test.

Nothing here imports Django: the test process talks to the gateway over HTTP only, and sets
the database up through `manage.py shell` in the gateway's own environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from bench.launch import (  # the same set-up as the live benchmarks
    REPO_ROOT,
    SETUP_CODE,
    free_port,
    group_end,
    group_members,
    postgres_create,
    postgres_drop,
    wait_ready,
)
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

STARTUP_LIMIT_S = 30.0


def one_tenant_yaml(url: str, slots: int) -> str:
    """The crash and outage tests' world: one class (INTERACTIVE, 60 s SLA), one tenant (acme), one
    backend (slow, ``slots`` slots)."""
    return scheduler_yaml(
        classes=["INTERACTIVE"],
        sla_ms={"INTERACTIVE": 60000},
        tenants=[tenant("acme", share=0.5)],
        backends=[backend("slow", url, slots=slots)],
    )


# Crash leftovers found in seconds, not the production 30 s (billing.heartbeats).
FAST_HOUSEKEEPING = {"FAIRGATE_HEARTBEAT_S": "1", "FAIRGATE_PROCESS_DEAD_AFTER_S": "5", "FAIRGATE_ORPHAN_SWEEP_S": "1"}


@dataclass
class Gateway:
    url: str
    env: dict[str, str]
    keys: dict[str, str]
    process: subprocess.Popen
    log_path: Path
    extra: dict = field(default_factory=dict)
    name: str = "the gateway"
    owns_database: bool = True  # False for another process serving the same database

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def shell(self, code: str) -> str:
        return self.manage("shell", "-v", "0", "-c", code)

    def sdk(self, key: str, **options) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", 30)
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys.get(key, key), **options)

    def http(self, key: str | None = None, **options) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys.get(key, key)}"} if key else {}
        options.setdefault("timeout", 30)
        return httpx.Client(base_url=self.url, headers=headers, **options)

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when absent)."""
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        text = httpx.get(f"{self.url}/metrics").text
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            metric, _, rest = series.partition("{")
            got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
            if metric == name and got == wanted:
                return float(value)
        return 0.0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, SIGKILL if it has not ended within 10 s; then its children (its process group:
        a billing worker, a file checker, a journal syncer) are waited for, and killed if they
        outlive a minute (bench.launch.group_end), before its database is dropped."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        group_end(self.process.pid)
        if self.owns_database and "DATABASE_URL" in self.env:
            postgres_drop(self.env["DATABASE_URL"])

    def billing_worker_pid(self) -> int:
        """Its one spawned child (multiprocessing's resource tracker is another child)."""
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        spawned = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(spawned) == 1, children
        return spawned[0]

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing of the process runs after it (its billing worker does)."""
        self.process.kill()
        self.process.wait(timeout=10)

    def group(self) -> list[int]:
        """The processes of its process group still running (itself and its children, wherever
        they were reparented)."""
        return group_members(self.process.pid)


def _postgres_database(var_dir: Path) -> str | None:
    """With DATABASE_URL on PostgreSQL (CI), a fresh database of its own for this gateway; else None
    (a SQLite file under ``var_dir``). Dropped again by ``Gateway.stop``."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return None
    name = "fg_live_" + var_dir.name.replace("-", "_").lower()[-40:] + f"_{os.getpid()}"
    return postgres_create(url.rsplit("/", 1)[0], name)


def gateway_env(var_dir: Path, yaml_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    database_url = _postgres_database(var_dir)
    if database_url:
        env["DATABASE_URL"] = database_url
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "FAIRGATE_VAR_DIR": str(var_dir),
            "FAIRGATE_CONFIG": str(yaml_path),
            "FAIRGATE_CONFIG_POLL_MS": "100",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
    )
    env.update(settings)
    if env.get("REDIS_URL") and "FAIRGATE_SHARED_PREFIX" not in settings:  # a shared scheduler's world each
        env["FAIRGATE_SHARED_PREFIX"] = f"fairgate:test:{var_dir.name}:{os.getpid()}:{time.monotonic_ns()}"
    return env


def start_gateway(
    var_dir: Path, yaml_text: str, keys: dict[str, tuple[str, str]], *, workers: int = 1, **settings: str
) -> Gateway:
    """Migrate, load ``yaml_text``, create ``keys`` (name -> (tenant, class)), serve (``--workers``
    processes: the shared scheduler's settings are the caller's); wait until ready."""
    var_dir.mkdir(parents=True, exist_ok=True)
    yaml_path = var_dir / "scheduler.yaml"
    yaml_path.write_text(yaml_text)
    env = gateway_env(var_dir, yaml_path, **settings)
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SETUP_CODE.format(yaml=str(yaml_path), keys=keys)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"gateway setup failed:\n{done.stdout}\n{done.stderr}"
    made = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("KEYS="))
    port = free_port()
    log_path = var_dir / "serve.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group of its own with its children: `Gateway.stop` ends them all
    )
    gateway = Gateway(f"http://127.0.0.1:{port}", env, made, process, log_path)
    wait_ready(gateway, "/readyz", limit_s=STARTUP_LIMIT_S)
    return gateway


def another_process(gateway: Gateway, name: str = "another gateway process") -> Gateway:
    """One more ``serve`` process on ``gateway``'s database, environment and keys (a replica behind
    the same load balancer, or a restart after a crash); waits until ready."""
    port = free_port()
    log_path = gateway.log_path.with_name(f"serve-{port}.log")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=gateway.env,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group of its own with its children: `Gateway.stop` ends them all
    )
    other = Gateway(
        f"http://127.0.0.1:{port}", gateway.env, gateway.keys, process, log_path, name=name, owns_database=False
    )
    wait_ready(other, "/readyz", limit_s=STARTUP_LIMIT_S)
    return other


def wait_for(read, ok, *, what: str, **options):
    """``read()``'s value once ``ok`` holds of it (polled as `wait_until`)."""
    found: list = []

    def holds() -> bool:
        found[:] = [read()]
        return ok(found[0])

    wait_until(holds, what=what, **options)
    return found[0]


def wait_until(predicate, *, limit_s: float = 10.0, step_s: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (bounded, never a speed assertion)."""
    deadline_s = time.monotonic() + limit_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline_s, f"{what} never held"
        time.sleep(step_s)


def celery_broker() -> dict[str, str]:
    """The broker a live test's worker and gateway share: Redis when REDIS_URL is set (as in
    production), else kombu's file transport (as `make demo` runs); a queue of the test's own."""
    broker = {} if os.environ.get("REDIS_URL") else {"CELERY_BROKER_URL": "filesystem://localhost/"}
    return {"CELERY_TASK_DEFAULT_QUEUE": f"test-{os.getpid()}-{time.monotonic_ns()}", **broker}


def start_celery(env: dict[str, str], log_path: Path, *, beat: bool = False, concurrency: int = 4) -> subprocess.Popen:
    """A real Celery worker process (threads pool) on the gateway's broker and queue, or its beat
    (its schedule file beside the log)."""
    celery = str(Path(sys.executable).with_name("celery"))
    if beat:
        argv = [celery, "-A", "config", "beat", "--schedule", str(log_path.with_suffix(".schedule"))]
    else:
        argv = [celery, "-A", "config", "worker", "--pool", "threads", "--concurrency", str(concurrency)]
    return subprocess.Popen(
        [*argv, "--loglevel", "INFO"], cwd=REPO_ROOT, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT
    )


def stop_process(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        process.wait(timeout=20)
