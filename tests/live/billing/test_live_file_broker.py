"""The embedded default runs real Celery: with CELERY_BROKER_URL=filesystem://localhost/ (what `make demo`
sets) a task goes through kombu's file transport in var/celery to a real `celery -A config worker`
process, and beat's schedule reaches the worker — no server installed, no eager mode. The
webhook's receiver checks the delivery's signature (billing.webhooks) before it takes the body."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from billing.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature_valid
from tests.support.livestack import REPO_ROOT, wait_until

pytestmark = pytest.mark.live

SETUP = """
from decimal import Decimal
from billing.models import TenantBilling
from billing.services import ledger_adjust
from tenants.models import Tenant
TenantBilling.objects.create(
    tenant=Tenant.objects.get(slug="acme"),
    webhook_url={url!r},
    webhook_secret={secret!r},
    alert_thresholds_pct=[80, 100],
)
ledger_adjust(tenant_slug="acme", amount=Decimal("80"), reason="seed", author="test")
"""
SWEPT = re.compile(r"Task billing\.holds_release_orphaned\[[0-9a-f-]+\] succeeded")
DELIVERED = """
from billing.models import BudgetAlert
print([(a.threshold_pct, a.webhook_delivered_at is not None) for a in BudgetAlert.objects.all()])
"""


SECRET = "test-endpoint-secret"


@pytest.fixture
def receiver():
    """A webhook endpoint: the JSON bodies POSTed to it whose signature is valid (others: 401)."""
    bodies: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            stamp, given = self.headers.get(TIMESTAMP_HEADER, ""), self.headers.get(SIGNATURE_HEADER, "")
            if not signature_valid(SECRET, stamp, raw, given):
                self.send_response(401)
                self.end_headers()
                return
            bodies.append(json.loads(raw))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies
    server.shutdown()


def _env(var_dir: Path) -> dict[str, str]:
    """The embedded default: SQLite under ``var_dir``, no Redis, the file broker."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        FAIRGATE_VAR_DIR=str(var_dir),
        CELERY_BROKER_URL="filesystem://localhost/",
        FAIRGATE_ORPHAN_SWEEP_S="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _celery(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("celery")), "-A", "config", *args, "--loglevel", "INFO"],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def test_an_alert_waits_in_the_file_broker_until_a_real_worker_delivers_it(tmp_path, receiver):
    url, bodies = receiver
    env = _env(tmp_path)
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "tenant", "create", "acme", "--name", "Acme", "--quota-share", "0.3", "--annual-budget", "100")
    _manage(
        env, "shell", "-v", "0", "-c", SETUP.format(url=url, secret=SECRET)
    )  # crosses 80 %: the alert's task is sent
    assert _manage(env, "shell", "-v", "0", "-c", DELIVERED).strip() == "[(80, False)]"  # nobody ran it
    queued = list((tmp_path / "celery" / "queue").iterdir())
    assert len(queued) == 1  # the task, as a message file of the broker
    worker = _celery(env, tmp_path / "worker.log", "worker", "--concurrency", "1", "--pool", "solo")
    try:
        wait_until(lambda: bodies, limit_s=60, step_s=0.2, what="the webhook called by the worker")
        assert bodies[0]["tenant"] == "acme" and bodies[0]["threshold_pct"] == 80
        wait_until(
            lambda: _manage(env, "shell", "-v", "0", "-c", DELIVERED).strip() == "[(80, True)]",
            limit_s=30,
            step_s=0.5,
            what="the alert marked delivered",
        )
        beat = _celery(env, tmp_path / "beat.log", "beat", "--schedule", str(tmp_path / "beat-schedule"))
        try:  # beat's schedule (the orphaned-holds sweep, every FAIRGATE_ORPHAN_SWEEP_S) runs in the worker
            wait_until(
                lambda: SWEPT.search((tmp_path / "worker.log").read_text()),
                limit_s=60,
                step_s=0.5,
                what="a task beat scheduled, run by the worker",
            )
        finally:
            _stop(beat)
    finally:
        _stop(worker)
    assert len(bodies) == 1  # delivered once
