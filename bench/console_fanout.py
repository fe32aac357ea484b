"""Console fan-out: many WebSocket viewers while a deep queue drains.

    python -m bench.console_fanout [--viewers 200] [--waiting 10000] [--dispatch-per-s 50]
                                   [--tenants 20] [--seconds 20]

One served Fairgate process (uvicorn on ``config.asgi.application``, the real dispatcher,
publisher and consumers) is loaded *inside* its event loop with ``--waiting`` BATCH requests
admitted to the dispatcher and kept topped up, and a stand-in backend of ``dispatch_per_s``
slots holding each request 1 s (so that many dispatch per second). No HTTP client holds ten
thousand connections: this measures the console, not the proxy. Every second each tenant also
gets an INTERACTIVE *marker* whose id carries its admission time (wall ms), so a viewer that
first sees it in a snapshot knows how long the change took to reach it.

The viewers (``websockets`` clients with real session cookies, spread over the tenants) run in
this process. Server CPU is read from /proc for the server process over the same window, once
without viewers and once with them, so the console's own cost is their difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVICE_S = 1.0
MARK = "mk-"


# --- the server side (runs in the served process) ----------------------------------------------


def _yaml(tenants: int, slots: int) -> str:
    rows = "\n".join(f"    - {{slug: t{i:02d}, name: Tenant {i}, quota_share: 0.05}}" for i in range(tenants))
    return f"""scheduler:
  policy: fairgate
  classes:
    - {{name: INTERACTIVE, level: 0, sla_ms: 600000,  price_factor: 1.6}}
    - {{name: BATCH,       level: 2, sla_ms: 3600000, price_factor: 0.7}}
  queue: {{depth_cap: 1000000, enforce_depth: false, service_ms_prior: 1000}}
  tenants:
{rows}
  backends:
    - {{name: stand-in, url: "http://127.0.0.1:9/v1", models: [m], slots: {slots}}}
"""


class Load:
    """Keeps ``waiting`` requests queued; a stand-in backend serves each granted one for 1 s."""

    def __init__(self, *, waiting: int, tenants: int) -> None:
        self.waiting, self.tenants = waiting, [f"t{i:02d}" for i in range(tenants)]
        self.serial = 0

    def admit(self, d, tenant: str, cls: str, public_id: str) -> None:
        from scheduling.engine.model import Request

        request = Request(
            id=f"{tenant}/{public_id}",
            tenant=tenant,
            cls=cls,
            model="m",
            prompt_tokens=100,
            expected_output_tokens=100,
            enqueued_ms=d.now_ms(),
        )
        entry = d.admit_now(request, public_id=public_id, declared_class=cls, rule=None)
        asyncio.get_running_loop().create_task(self.serve(d, entry))

    async def serve(self, d, entry) -> None:
        from gateway.errors import GatewayError

        try:
            await entry.future
        except GatewayError:  # shutting down
            return
        await asyncio.sleep(SERVICE_S)
        d.end(entry, "completed", prompt_tokens=100, output_tokens=100, served=True)

    async def run(self) -> None:
        from gateway.runtime import current

        while current() is None:
            await asyncio.sleep(0.05)
        d = current()
        next_mark_s = 0.0
        while True:
            while d.sched.waiting_count < self.waiting:
                self.serial += 1
                self.admit(d, self.tenants[self.serial % len(self.tenants)], "BATCH", f"w-{self.serial}")
            if time.time() >= next_mark_s:
                next_mark_s = time.time() + 1.0
                for tenant in self.tenants:
                    self.serial += 1
                    self.admit(d, tenant, "INTERACTIVE", f"{MARK}{int(time.time() * 1000)}-{self.serial}")
            await asyncio.sleep(0.05)


class WithLoad:
    """The ASGI app, plus the load task once the lifespan startup (dispatcher, publisher) is done."""

    def __init__(self, app, load: Load) -> None:
        self.app, self.load = app, load

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def started(message) -> None:
            if message["type"] == "lifespan.startup.complete":
                asyncio.get_running_loop().create_task(self.load.run())
            await send(message)

        await self.app(scope, receive, started)


def serve(port: int, waiting: int, tenants: int) -> None:
    import django
    import uvicorn

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from config.asgi import application

    uvicorn.run(
        WithLoad(application, Load(waiting=waiting, tenants=tenants)),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
    )


SETUP = """
import json
from django.core.management import call_command
from django.test import Client
from console.services import user_create
call_command("migrate", verbosity=0)
call_command("scheduler_config", "load", {yaml!r}, actor="bench", stdout=open("/dev/null", "w"))
sessions = {{}}
for i in range({tenants}):
    slug = f"t{{i:02d}}"
    user = user_create(username=f"viewer-{{slug}}", role="member", tenant_slug=slug, password=None, actor="bench")
    client = Client(); client.force_login(user); sessions[slug] = client.cookies["sessionid"].value
admin = user_create(username="bench-admin", role="admin", tenant_slug=None, password=None, actor="bench")
client = Client(); client.force_login(admin); sessions["admin"] = client.cookies["sessionid"].value
print("SESSIONS=" + json.dumps(sessions))
"""


# --- the viewer side ----------------------------------------------------------------------------


class Viewer:
    def __init__(self) -> None:
        self.messages = 0
        self.seen: set[str] = set()
        self.latencies_ms: list[float] = []
        self.ops: dict | None = None
        self.timeline: dict[int, dict] = {}

    def take(self, text: str, counting: bool) -> None:
        data = json.loads(text)
        if counting:
            self.messages += 1
        if data.get("type") == "ops":
            self.ops = data
            for point in data.get("timeline", ()):
                self.timeline[point["at_ms"]] = point
        queue = data.get("queue")
        if not queue:
            return
        now_ms = time.time() * 1000
        for row in queue["rows"]:
            rid = row["id"]
            if rid.startswith(MARK) and rid not in self.seen:
                self.seen.add(rid)
                if counting:
                    self.latencies_ms.append(now_ms - int(rid[len(MARK) :].split("-")[0]))


async def watch(url: str, session: str, origin: str, viewer: Viewer, window: dict, stop: asyncio.Event) -> None:
    import websockets

    headers = {"Cookie": f"sessionid={session}", "Origin": origin}
    async with websockets.connect(url, additional_headers=headers, max_size=2**24) as socket:
        while not stop.is_set():
            try:
                text = await asyncio.wait_for(socket.recv(), 0.5)
            except TimeoutError:
                continue
            viewer.take(text, window["open"])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(pid: int, seconds: float) -> float:
    """Server CPU (share of one core) over ``seconds``."""
    start = cpu_s(pid)
    await asyncio.sleep(seconds)
    return (cpu_s(pid) - start) / seconds


async def bench(args, url: str, sessions: dict[str, str], pid: int) -> dict:
    origin = url.replace("ws://", "http://").split("/ws/")[0]
    admin = Viewer()
    stop, window = asyncio.Event(), {"open": False}
    tasks = [asyncio.create_task(watch(url, sessions["admin"], origin, admin, {"open": True}, stop))]
    await asyncio.sleep(args.warmup_s)
    cpu_idle = await measure(pid, args.seconds)
    tenants = [s for s in sessions if s != "admin"]
    viewers = [Viewer() for _ in range(args.viewers)]
    for i, viewer in enumerate(viewers):
        tasks.append(asyncio.create_task(watch(url, sessions[tenants[i % len(tenants)]], origin, viewer, window, stop)))
    await asyncio.sleep(args.warmup_s)
    window["open"] = True
    opened_ms = time.time() * 1000
    cpu_viewers = await measure(pid, args.seconds)
    window["open"] = False
    await asyncio.sleep(2.5)  # one more operations push
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    rates = [v.messages / args.seconds for v in viewers]
    latencies = sorted(x for v in viewers for x in v.latencies_ms)
    points = [admin.timeline[t] for t in sorted(admin.timeline) if t >= opened_ms - 5_000]
    return {
        "viewers": args.viewers,
        "tenants": args.tenants,
        "waiting_target": args.waiting,
        "in_queue_seen": (admin.ops or {}).get("in_queue"),
        "batch_completed_per_s": _rate(points),
        "markers_dispatched_per_s": args.tenants,
        "publisher_tick_ms": (admin.ops or {}).get("publisher_tick_ms"),
        "messages_per_viewer_per_s": {"mean": round(statistics.fmean(rates), 2), "max": round(max(rates), 2)},
        "change_to_viewer_ms": {"p50": _pct(latencies, 0.50), "p95": _pct(latencies, 0.95), "samples": len(latencies)},
        "server_cpu_share_of_one_core": {"no_viewers": round(cpu_idle, 3), "with_viewers": round(cpu_viewers, 3)},
    }


def _rate(points: list[dict]) -> float | None:
    """BATCH completions per second between the first and last timeline points of the window."""
    if len(points) < 2:
        return None
    first, last = points[0], points[-1]
    return round((last["batch_completed"] - first["batch_completed"]) * 1000 / (last["at_ms"] - first["at_ms"]), 1)


def _pct(values: list[float], q: float) -> float | None:
    return None if not values else round(values[min(len(values) - 1, int(q * len(values)))], 1)


def run(args) -> dict:
    var_dir = Path(tempfile.mkdtemp(prefix="console-fanout-"))
    yaml_path = var_dir / "bench.yaml"
    yaml_path.write_text(_yaml(args.tenants, args.dispatch_per_s))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "FAIRGATE_VAR_DIR": str(var_dir),
        "FAIRGATE_CONFIG": str(yaml_path),
        "LOG_LEVEL": "WARNING",
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-v",
            "0",
            "-c",
            SETUP.format(yaml=str(yaml_path), tenants=args.tenants),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode:
        raise SystemExit(f"setup failed:\n{done.stdout}\n{done.stderr}")
    sessions = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("SESSIONS="))
    port = args.port or _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.console_fanout",
            "serve",
            "--port",
            str(port),
            "--waiting",
            str(args.waiting),
            "--tenants",
            str(args.tenants),
        ],
        cwd=REPO_ROOT,
        env=env,
    )
    try:
        _wait_ready(port)
        return asyncio.run(bench(args, f"ws://127.0.0.1:{port}/ws/console/", sessions, server.pid))
    finally:
        server.terminate()
        server.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(port: int) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not start")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console_fanout", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    serve_p = sub.add_parser("serve", help="(internal) the loaded server")
    for p in (parser, serve_p):
        p.add_argument("--waiting", type=int, default=10_000)
        p.add_argument("--tenants", type=int, default=20)
        p.add_argument("--port", type=int, default=0)
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--dispatch-per-s", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        serve(args.port, args.waiting, args.tenants)
        return
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
