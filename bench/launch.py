"""Start the real stack for the live benchmarks: simulated backends and `manage.py serve`, each in
a process of its own, so the load generator (the benchmark's process) never shares a core's
event loop with what it measures.

The gateway always runs on the embedded default (a SQLite file under a temp directory, the
in-memory channel layer): DATABASE_URL and REDIS_URL of the caller are dropped. Nothing here
imports Django; the database is set up through `manage.py shell` in the gateway's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_LIMIT_S = 60.0
CHILDREN_LIMIT_S = 60.0  # a stopped gateway's children end within this, else they are killed

SETUP_CODE = """
import json
from django.core.management import call_command
from scheduling.selectors import class_names_active
from tenants.services import apikey_create
call_command("migrate", verbosity=0)
call_command("scheduler_config", "load", {yaml!r}, actor="setup", stdout=open("/dev/null", "w"))
known = class_names_active()
keys = {{
    name: apikey_create(tenant_slug=t, default_class=c, actor="setup", known_classes=known)[1]
    for name, (t, c) in {keys!r}.items()
}}
print("KEYS=" + json.dumps(keys))
"""


def postgres_create(server: str, name: str) -> str:
    """A fresh PostgreSQL database ``name`` on ``server`` (``postgres://user@host:port``), dropped
    first if a crashed run left it; returns its URL. (psycopg is imported here only: nothing else
    in this module needs a database driver.)"""
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def postgres_drop(url: str, *, attempts: int = 1) -> None:
    """Drop the database of ``url``, trying ``attempts`` times a second apart (a server coming back
    from a restart refuses connections for a moment)."""
    import psycopg

    server, name = url.rsplit("/", 1)
    for attempt in range(attempts):
        try:
            with psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.OperationalError:
            if attempt + 1 == attempts:
                raise
            time.sleep(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """One server process we started (and only we stop)."""

    name: str
    url: str
    process: subprocess.Popen
    log_path: Path
    keys: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # a gateway's environment (its workers need the same)
    group: bool = False  # leads a process group of its own (a gateway and its children): `stop` ends it all

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the process and its live children (the gateway's billing
        worker) have used so far (Linux /proc)."""
        return _cpu_s(self.process.pid)

    def own_cpu_s(self) -> float:
        """CPU seconds of the process itself (all its threads), without its children."""
        return _cpu_s(self.process.pid, children=False)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.group:
            group_end(self.process.pid)


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A work directory for one run's servers (their logs, a SQLite database): removed when the run
    ends well, kept and named on stderr when it fails."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"logs kept in {path}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(path, ignore_errors=True)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def group_end(pgid: int, *, limit_s: float = CHILDREN_LIMIT_S) -> list[int]:
    """Waits until process group ``pgid`` (a gateway started in a session of its own leads one) has
    no process left, at most ``limit_s``; SIGKILLs what is left then, and returns those pids."""
    deadline_s = time.monotonic() + limit_s
    while (left := group_members(pgid)) and time.monotonic() < deadline_s:
        time.sleep(0.1)
    if left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _cpu_s(pid: int, children: bool = True) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if children else []
    except FileNotFoundError:  # ended meanwhile
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(_cpu_s(int(c)) for c in kids)


def wait_ready(server, path: str, *, limit_s: float = READY_LIMIT_S) -> None:
    """Until ``server.url + path`` answers 200; ``server`` has name, url, process, log() and stop()."""
    deadline_s = time.monotonic() + limit_s
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited:\n{server.log()[-4000:]}")
        try:
            if httpx.get(f"{server.url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline_s:
            server.stop()
            raise RuntimeError(f"{server.name} was not ready within {limit_s:.0f} s:\n{server.log()[-4000:]}")
        time.sleep(0.1)


def start_sim(var_dir: Path, name: str = "sim", **options: object) -> Server:
    """``python -m simbackend`` with ``options`` (``slots=8`` -> ``--slots 8``)."""
    var_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", "simbackend", "--port", str(port)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    log_path = var_dir / f"{name}.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", process, log_path)
    wait_ready(server, "/healthz")
    return server


def gateway_env(var_dir: Path, yaml_path: Path, **settings: str) -> dict[str, str]:
    drop = {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "FAIRGATE_VAR_DIR": str(var_dir),
            "FAIRGATE_CONFIG": str(yaml_path),
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
    )
    env.update(settings)
    return env


def set_up(env: dict[str, str], yaml_path: Path, keys: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Migrate the database of ``env``, load the YAML, make the API keys; returns name -> key."""
    code = SETUP_CODE.format(yaml=str(yaml_path), keys=keys)
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"set-up failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1].removeprefix("KEYS="))


def start_gateway(
    var_dir: Path,
    yaml_text: str,
    keys: dict[str, tuple[str, str]],
    name: str = "gateway",
    serve_args: tuple[str, ...] = (),
    **settings: str,
) -> Server:
    """Migrate a fresh SQLite database, load ``yaml_text``, create ``keys`` (name -> (tenant, class)),
    then ``manage.py serve`` (with ``serve_args``, e.g. ``--workers 2``); returns once /readyz
    answers 200. ``settings`` are extra env vars."""
    var_dir.mkdir(parents=True, exist_ok=True)
    yaml_path = var_dir / "scheduler.yaml"
    yaml_path.write_text(yaml_text)
    env = gateway_env(var_dir, yaml_path, **settings)
    made = set_up(env, yaml_path, keys)
    port = free_port()
    log_path = var_dir / f"{name}.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), *serve_args],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own with its children: `Server.stop` ends them all
        )
    server = Server(name, f"http://127.0.0.1:{port}", process, log_path, keys=made, env=env, group=True)
    wait_ready(server, "/readyz")
    return server


def start_worker(env: dict[str, str], log_path: Path, *, concurrency: int, name: str = "worker") -> Server:
    """A Celery worker process (threads pool, ``concurrency`` threads) in a gateway's environment
    ``env`` (its broker, queue and database); returns once it says it is ready (its log, INFO)."""
    argv = [str(Path(sys.executable).with_name("celery")), "-A", "config", "worker", "--pool", "threads"]
    argv += ["--concurrency", str(concurrency), "--loglevel", "INFO"]
    with log_path.open("w") as log_file:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(name, "", process, log_path, env=env)
    deadline_s = time.monotonic() + READY_LIMIT_S
    while " ready." not in server.log():
        if process.poll() is not None or time.monotonic() > deadline_s:
            server.stop()
            raise RuntimeError(f"{name} did not start within {READY_LIMIT_S:.0f} s:\n{server.log()[-4000:]}")
        time.sleep(0.2)
    return server


class KeptWorker:
    """A Celery worker kept running as a process supervisor would keep it: a watcher thread starts
    it again whenever it exits (each start logs to a file of its own: worker.log, worker-2.log ...).
    The CPU of a worker that ended counts as last seen (at most ``check_s`` before it ended)."""

    def __init__(self, env: dict[str, str], var_dir: Path, *, concurrency: int, check_s: float = 0.5) -> None:
        self.env, self.var_dir, self.concurrency, self.check_s = env, var_dir, concurrency, check_s
        self.workers: list[Server] = []
        self.failed = ""  # a start again that did not come up: the watcher gave up
        self._ended_cpu_s = self._last_cpu_s = 0.0
        self._stop = threading.Event()
        self.current = self._start()
        self._thread = threading.Thread(target=self._watch, name="worker-keeper", daemon=True)
        self._thread.start()

    def _start(self) -> Server:
        name = "worker" if not self.workers else f"worker-{len(self.workers) + 1}"
        server = start_worker(self.env, self.var_dir / f"{name}.log", concurrency=self.concurrency, name=name)
        self.workers.append(server)
        return server

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            if self.current.process.poll() is None:
                self._last_cpu_s = self.current.cpu_s()
                continue
            self._ended_cpu_s, self._last_cpu_s = self._ended_cpu_s + self._last_cpu_s, 0.0
            try:
                self.current = self._start()
            except RuntimeError as failed:
                self.failed = str(failed)[:300]
                return

    @property
    def restarts(self) -> int:
        return len(self.workers) - 1

    def cpu_s(self) -> float:
        alive = self.current.process.poll() is None
        return self._ended_cpu_s + (self.current.cpu_s() if alive else self._last_cpu_s)

    def log(self) -> str:
        return "".join(worker.log() for worker in self.workers)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=READY_LIMIT_S + 5)
        self.current.stop()
