"""The console's live stack for browser tests: the real `manage.py serve`, a simulated GPU backend
behind a gate (``sim.gate``), a Celery worker, and Debian's Chromium driven by Playwright.
Tests wait for states, never for times; ``LIMIT_S`` and ``WAIT_MS`` are safety nets only."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from simbackend import RunningSim, SimConfig, start_in_thread
from tests.support.livestack import (
    REPO_ROOT,
    Gateway,
    celery_broker,
    start_celery,
    start_gateway,
    stop_process,
    wait_until,
)

playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is in the dev extras")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = REPO_ROOT / "artifacts" / "console"
SERVICE_MS = 1200
LIMIT_S = 60.0  # a safety net for every wait, never what decides an outcome
WAIT_MS = int(LIMIT_S * 1000)

YAML = """scheduler:
  policy: fairgate
  classes:
    - {name: INTERACTIVE, level: 0, sla_ms: 30000,  price_factor: 1.6}
    - {name: BATCH,       level: 2, sla_ms: 120000, price_factor: 0.7}
  aging:
    mode: piecewise
    segments:
      - {wait_ratio: "0-0.50",    boost: 0}
      - {wait_ratio: "0.50-0.80", boost: "linear",    k: 1.0}
      - {wait_ratio: "0.80-0.95", boost: "quadratic", k: 2.2}
      - {wait_ratio: ">=0.95",    boost: "preempt"}
  tenants:
    - {slug: alpha, name: Alpha, quota_share: 0.5, annual_budget: 1000}
    - {slug: beta,  name: Beta,  quota_share: 0.5, annual_budget: 1000}
  queue: {depth_cap: 100, service_ms_prior: %(service)d}
  backends:
    - {name: b-one, url: "%(url)s", models: [m-one], slots: 1, input_price_per_1k: 1, output_price_per_1k: 2}
"""

USERS = """
from console.services import user_create
user_create(username="ann", role="member", tenant_slug="alpha", password="ann-password-1", actor="test")
user_create(username="bob", role="member", tenant_slug="beta", password="bob-password-1", actor="test")
user_create(username="ada", role="admin", tenant_slug=None, password="ada-password-1", actor="test")
user_create(username="fay", role="finance", tenant_slug=None, password="fay-password-1", actor="test")
"""

LEDGER = """
from billing.models import LedgerEntry
for e in LedgerEntry.objects.filter(kind="charge", request_id__endswith={rid!r}):
    print("CHARGE", e.amount, e.factor, e.base_cost)
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSim]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    sim = start_in_thread(SimConfig(port=0, slots=1, fixed_latency_ms=SERVICE_MS, seed=3))
    yield sim
    sim.gate.open()
    sim.stop()


@pytest.fixture(scope="module")
def stack(sim, tmp_path_factory) -> Iterator[Gateway]:
    yaml_text = YAML % {"url": f"{sim.url}/v1", "service": SERVICE_MS}
    var_dir = tmp_path_factory.mktemp("console-live")
    gateway = start_gateway(
        var_dir, yaml_text, {"alpha": ("alpha", "BATCH"), "beta": ("beta", "BATCH")}, **celery_broker()
    )
    gateway.shell(USERS)
    worker = start_celery(gateway.env, var_dir / "worker.log")  # runs the batch lines the engine grants
    yield gateway
    stop_process(worker)
    gateway.stop()


@pytest.fixture
def gate(sim):
    """The backend's gate, open again after the test whatever happened in it."""
    yield sim.gate
    sim.gate.open()


@pytest.fixture(scope="module")
def browser(stack):
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs a loop in this thread
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with playwright_api.sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


def login(browser, stack: Gateway, username: str, password: str):
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{stack.url}/console/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("#login")
    page.wait_for_load_state()
    return page


def send(stack: Gateway, key: str, request_id: str, results: dict) -> threading.Thread:
    def run() -> None:
        raw = stack.sdk(key, timeout=LIMIT_S * 2).chat.completions.with_raw_response.create(
            model="m-one",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            extra_headers={"X-Request-Id": request_id},
        )
        results[request_id] = raw.headers

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def held_at_backend(gate) -> None:
    """Wait until the request on the backend's only slot is held there by the gate."""
    wait_until(lambda: gate.waiting == 1, limit_s=LIMIT_S, what="a request held at the backend's gate")
