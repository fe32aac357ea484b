"""The production shape for the fault runs (bench.faults): the Procfile's `web`, `worker` and `beat`
on a scratch PostgreSQL database and a Redis db number of their own, and the simulated backend.

Every production process is started from the Procfile's own line (``sh -c "exec <command>"`` in a
session of its own, so a signal meant for one process never reaches another), with the project's
environment on PATH and DATABASE_URL / REDIS_URL / SECRET_KEY set, as a deployment would. The
scratch database is created and migrated here and dropped by `Stack.stop`; with
``db_fault="proxy"`` the processes reach PostgreSQL through tests.support.pgproxy.PgProxy (which
the bench can cut) while the bench counts through the direct URL. Nothing here imports Django.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from bench.launch import (
    REPO_ROOT,
    Server,
    free_port,
    gateway_env,
    postgres_create,
    postgres_drop,
    set_up,
    start_sim,
    wait_ready,
)

PROCFILE = REPO_ROOT / "Procfile"
PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")  # as honcho and foreman read it
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432"
DEFAULT_REDIS = "redis://127.0.0.1:6379"
CELERY_READY = {"worker": "ready.", "beat": "beat: Starting"}
STOP_LIMIT_S = 20.0


def procfile(path: Path = PROCFILE) -> dict[str, str]:
    """process type -> command."""
    return {m[1]: m[2] for line in path.read_text().splitlines() if (m := PROCFILE_LINE.match(line))}


def pg_server() -> str:
    """The PostgreSQL server to make the scratch database on: DATABASE_URL's, if it is PostgreSQL."""
    url = os.environ.get("DATABASE_URL", "")
    return url.rsplit("/", 1)[0] if url.startswith(("postgres://", "postgresql://")) else DEFAULT_PG


def redis_server() -> str:
    """``redis://host:port`` of REDIS_URL, else the machine's Redis."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return DEFAULT_REDIS
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def redis_flush(url: str) -> None:
    import redis

    redis.Redis.from_url(url, socket_connect_timeout=5).flushdb()


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Stack:
    var_dir: Path
    env: dict[str, str]  # the production processes' environment
    direct_url: str  # the scratch database, not through the proxy: for counting
    keys: dict[str, str]  # key name -> API key
    commands: dict[str, str]  # Procfile
    port: int
    sim: Server
    proxy: object | None = None  # tests.support.pgproxy.PgProxy with db_fault="proxy"
    procs: dict[str, Server] = field(default_factory=dict)  # web, worker, beat
    restarts: list[str] = field(default_factory=list)  # what the bench restarted, as a supervisor

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- processes ----------------------------------------------------------------------

    def spawn(self, name: str) -> Server:
        """Start the Procfile's ``name`` (appending to its log); returns once it is ready."""
        log_path = self.var_dir / f"{name}.log"
        env = {**self.env, "PORT": str(self.port)}
        with log_path.open("a") as log_file:
            process = subprocess.Popen(
                ["sh", "-c", f"exec {self.commands[name]}"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(name, self.url if name == "web" else "", process, log_path)
        self.procs[name] = server
        if name == "web":
            wait_ready(server, "/readyz")
        else:
            log_wait(server, CELERY_READY[name], since=log_path.stat().st_size)
        return server

    def web_pid(self) -> int:
        return self.procs["web"].process.pid

    def billing_worker_pid(self) -> int | None:
        """The gateway's spawned child (multiprocessing's resource tracker is another child)."""
        pid = self.web_pid()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            return next((int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()), None)
        except FileNotFoundError:
            return None

    def kill(self, name: str) -> int:
        """SIGKILL, as a crash; returns the pid."""
        process = self.procs[name].process
        process.kill()
        process.wait(timeout=10)
        return process.pid

    def supervise(self) -> list[str]:
        """Start again whatever production process has exited (as a supervisor would); names them."""
        gone = [name for name, server in self.procs.items() if server.process.poll() is not None]
        for name in gone:
            _log(f"  {name} had exited (rc {self.procs[name].process.returncode}): starting it again")
            self.spawn(name)
        self.restarts += gone
        return gone

    def sim_restart(self) -> None:
        """The simulated backend again, on the same port (its argv names it)."""
        with self.sim.log_path.open("a") as log_file:
            process = subprocess.Popen(self.sim.process.args, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        self.sim = Server(self.sim.name, self.sim.url, process, self.sim.log_path)
        wait_ready(self.sim, "/healthz")

    # --- the database -------------------------------------------------------------------

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.direct_url, connect_timeout=10) as conn:
            return conn.execute(sql, params).fetchall()

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        """``manage.py`` on the direct database URL."""
        env = {**self.env, "DATABASE_URL": self.direct_url}
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
        )

    def stop(self) -> None:
        for server in (*self.procs.values(), self.sim):
            _terminate(server.process)
        if self.proxy is not None:
            self.proxy.stop()
        postgres_drop(self.direct_url, attempts=30)  # the server may be coming back from a restart fault
        try:
            redis_flush(self.env["REDIS_URL"])
        except Exception as failed:  # noqa: BLE001 - Redis down after a fault: nothing of ours is left in it
            _log(f"could not flush {self.env['REDIS_URL']}: {failed}")


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM to the process alone (not its group), then SIGKILL to what is left of its session."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # children left behind (a prefork pool, a billing worker)
    except (ProcessLookupError, PermissionError):
        pass


def log_wait(server: Server, text: str, *, since: int = 0, limit_s: float = 60.0) -> None:
    deadline_s = time.monotonic() + limit_s
    while text not in server.log()[since:]:
        if server.process.poll() is not None or time.monotonic() > deadline_s:
            raise RuntimeError(f"{server.name} did not say {text!r}:\n{server.log()[-4000:]}")
        time.sleep(0.2)


def production_env(
    var_dir: Path, yaml_path: Path, database_url: str, redis_url: str, **settings: str
) -> dict[str, str]:
    env = gateway_env(
        var_dir,
        yaml_path,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        SECRET_KEY=f"faults-{secrets.token_hex(24)}",
        **settings,
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python`, `celery`
    env.pop("FAIRGATE_REQUIRE_SERVICES", None)
    return env


def stack_start(
    var_dir: Path,
    yaml_text: str,
    keys: dict[str, tuple[str, str]],
    *,
    redis_db: int,
    db_fault: str = "restart",
    sim_options: dict | None = None,
    **settings: str,
) -> Stack:
    """Everything up and ready; ``yaml_text`` has ``{url}`` for the backend's base URL."""
    var_dir.mkdir(parents=True, exist_ok=True)
    sim = start_sim(var_dir, **(sim_options or {}))
    direct_url = postgres_create(pg_server(), f"fg_faults_{os.getpid()}_{redis_db}")
    proxy = None
    if db_fault == "proxy":
        from tests.support.pgproxy import PgProxy  # the live tests' cuttable TCP proxy

        host, port = urlsplit(direct_url).hostname, urlsplit(direct_url).port or 5432
        proxy = PgProxy(host, port).start()
    yaml_path = var_dir / "scheduler.yaml"
    yaml_path.write_text(yaml_text.format(url=f"{sim.url}/v1"))
    redis_url = f"{redis_server()}/{redis_db}"
    redis_flush(redis_url)
    database_url = proxy.url_through(direct_url) if proxy else direct_url
    env = production_env(var_dir, yaml_path, database_url, redis_url, **settings)
    stack = Stack(var_dir, env, direct_url, {}, procfile(), free_port(), sim, proxy)
    try:
        stack.keys = set_up({**env, "DATABASE_URL": direct_url}, yaml_path, keys)
        for name in ("web", "worker", "beat"):
            stack.spawn(name)
    except BaseException:
        stack.stop()
        raise
    return stack
