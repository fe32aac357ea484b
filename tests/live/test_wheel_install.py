"""The built wheel as a user installs it: built from this checkout (`python -m build`: the sdist, then
the wheel from it), pip-installed into a fresh virtual environment (no system site-packages; the
dependencies from the package index), and run from an empty folder through the `fairgate` console
script only: migrate a fresh database, load a scheduler YAML, create a tenant and a key, the
simulated backend and `serve`; then one chat through the openai SDK and the console's Chart.js.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from bench.launch import REPO_ROOT, Server, free_port, postgres_create, postgres_drop, wait_ready
from tests.support.scheduler_yaml import backend, scheduler_yaml

pytestmark = pytest.mark.live
BUILD_LIMIT_S = 600.0
INSTALL_LIMIT_S = 900.0  # the dependencies from the package index (pip's cache makes it short)
# The caller's Python, Django and Fairgate settings stay behind: the install must stand on its own.
LEFT_BEHIND_PREFIXES = ("PYTHON", "DJANGO_", "FAIRGATE_", "CELERY_")
LEFT_BEHIND = {"VIRTUAL_ENV", "DATABASE_URL", "REDIS_URL", "SECRET_KEY"}


def run(argv: list[str], *, cwd: Path, env: dict[str, str], limit_s: float = 120.0) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit_s)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def outside_env(venv: Path | None = None, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEFT_BEHIND_PREFIXES) and k not in LEFT_BEHIND}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **settings}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel built from this checkout installed in it."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(REPO_ROOT)],
        cwd=root,
        env=outside_env(),
        limit_s=BUILD_LIMIT_S,
    )
    wheels = list(dist.glob("fairgate-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=root, env=outside_env())
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, str(wheels[0])], cwd=root, env=outside_env(), limit_s=INSTALL_LIMIT_S)
    return venv


@pytest.fixture
def database_url(tmp_path):
    """A scratch PostgreSQL database when DATABASE_URL points at PostgreSQL (CI), else None (SQLite
    in the install's default state folder)."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        yield None
        return
    scratch = postgres_create(url.rsplit("/", 1)[0], f"fg_wheel_{os.getpid()}")
    yield scratch
    postgres_drop(scratch)


def start(name: str, argv: list[str], *, cwd: Path, env: dict[str, str], ready_path: str, port: int) -> Server:
    log_path = cwd.parent / f"{name}.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", process, log_path)
    wait_ready(server, ready_path)
    return server


def test_the_installed_wheel_migrates_serves_a_chat_and_the_console_assets(venv, database_url, tmp_path):
    work = tmp_path / "work"  # an empty folder: nothing of the checkout is importable from here
    work.mkdir()
    state_home = tmp_path / "state"
    settings = {"XDG_STATE_HOME": str(state_home), "SECRET_KEY": "wheel-test-" + os.urandom(8).hex()}
    if database_url:
        settings["DATABASE_URL"] = database_url
    env = outside_env(venv, **settings)
    fairgate = str(venv / "bin" / "fairgate")

    where = run(
        [
            fairgate,
            "shell",
            "-v",
            "0",
            "-c",
            "import config; from django.conf import settings as s; print(config.__file__); print(s.VAR_DIR)",
        ],
        cwd=work,
        env=env,
    ).split()
    assert Path(where[0]).is_relative_to(venv)  # the installed package, not the checkout
    assert Path(where[1]) == state_home / "fairgate"  # runtime state outside the install

    run([fairgate, "migrate", "--noinput"], cwd=work, env=env)
    servers: list[Server] = []
    try:
        sim_port = free_port()
        servers.append(
            start(
                "sim",
                [fairgate, "simbackend", "--port", str(sim_port)],
                cwd=work,
                env=env,
                ready_path="/healthz",
                port=sim_port,
            )
        )
        yaml_path = work / "scheduler.yaml"
        yaml_path.write_text(
            scheduler_yaml(tenants=[], backends=[backend("sim", f"{servers[0].url}/v1", models=["m"])])
        )
        run([fairgate, "scheduler_config", "load", str(yaml_path)], cwd=work, env=env)
        run(
            [fairgate, "tenant", "create", "acme", "--name", "Acme", "--quota-share", "0.5", "--annual-budget", "1000"],
            cwd=work,
            env=env,
        )
        key = run([fairgate, "apikey", "create", "acme", "--class", "INTERACTIVE"], cwd=work, env=env).strip()

        port = free_port()
        serve = [fairgate, "serve", "--host", "127.0.0.1", "--port", str(port)]
        servers.append(start("serve", serve, cwd=work, env=env, ready_path="/readyz", port=port))
        gateway = servers[-1].url

        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=30)
        completion = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
        )
        assert completion.choices[0].message.content
        assert completion.usage is not None and completion.usage.completion_tokens == 5

        chart = httpx.get(f"{gateway}/static/console-vendor/chart.umd.js", timeout=10)
        assert chart.status_code == 200, chart.status_code
        assert "Chart.js v4" in chart.text[:200]
        assert httpx.get(f"{gateway}/static/console/console.css", timeout=10).status_code == 200
    finally:
        for server in reversed(servers):
            server.stop()
