"""The console in a real browser (Playwright driving Debian's Chromium) against the real
`manage.py serve` and a simulated GPU backend, with the official `openai` SDK as the client.
Screenshots go to artifacts/console/."""
from __future__ import annotations

import os
import re
import threading
from decimal import Decimal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.simbackend import SimConfig, start_in_thread
from tests.gateway.livestack import REPO_ROOT, Gateway, start_gateway, wait_until

pytestmark = pytest.mark.live
playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is in the dev extras")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SHOTS = REPO_ROOT / "artifacts" / "console"
SERVICE_MS = 1200

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
"""

LEDGER = """
from billing.models import LedgerEntry
for e in LedgerEntry.objects.filter(kind="charge", request_id__endswith={rid!r}):
    print("CHARGE", e.amount, e.factor, e.base_cost)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Gateway]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    sim = start_in_thread(SimConfig(port=0, slots=1, fixed_latency_ms=SERVICE_MS, seed=3))
    yaml_text = YAML % {"url": f"{sim.url}/v1", "service": SERVICE_MS}
    gateway = start_gateway(tmp_path_factory.mktemp("console-live"), yaml_text,
                            {"alpha": ("alpha", "BATCH"), "beta": ("beta", "BATCH")})
    gateway.shell(USERS)
    yield gateway
    gateway.stop()
    sim.stop()


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
    page.goto(f"{stack.url}/console/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("#login")
    page.wait_for_load_state()
    return page


def send(stack: Gateway, key: str, request_id: str, results: dict) -> threading.Thread:
    def run() -> None:
        raw = stack.sdk(key, timeout=60).chat.completions.with_raw_response.create(
            model="m-one", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            extra_headers={"X-Request-Id": request_id})
        results[request_id] = raw.headers

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def cell(page, request_id: str, column: str) -> str | None:
    row = page.locator(f"#queue-table tr[data-id='{request_id}'] td.{column}")
    return row.inner_text() if row.count() else None


def charges_of(stack: Gateway, request_id: str) -> list[tuple[str, str, str]]:
    """(amount, factor, base cost) of the request's charge entries in the gateway's ledger."""
    return re.findall(r"CHARGE (\S+) (\S+) (\S+)", stack.shell(LEDGER.format(rid=request_id)))


def test_member_watches_position_and_eta_fall_then_the_charge(stack, browser):
    page = login(browser, stack, "ann", "ann-password-1")
    assert page.url.endswith("/console/queue/")
    page.wait_for_selector("#live-status.on")
    results: dict = {}
    ids = [f"live-{i}" for i in range(4)]
    threads = []
    for rid in ids:
        threads.append(send(stack, "alpha", rid, results))
        page.wait_for_selector(f"#queue-table tr[data-id='{rid}']", timeout=5000)
    last = ids[-1]
    page.fill("#watch-id", last)
    page.click("#watch-form button")
    first = int(wait_until(lambda: cell(page, last, "position") not in (None, "—") and cell(page, last, "position"),
                           what="a position for the last request"))
    eta_first = cell(page, last, "eta")
    assert first >= 2, f"the last of 4 requests on one slot should wait behind others, got position {first}"
    page.screenshot(path=str(SHOTS / "queue-waiting.png"), full_page=True)
    wait_until(lambda: page.locator("#card [data-field=position]").inner_text() == cell(page, last, "position"),
               what="the followed request's card to agree with its row")
    seen = [first]

    def moved() -> bool:
        text = cell(page, last, "position")
        if text and text != "—" and int(text) < seen[-1]:
            seen.append(int(text))
        return seen[-1] == 1 or cell(page, last, "eta") == "running"

    wait_until(moved, limit_s=SERVICE_MS / 1000 * 6, step_s=0.05, what="the position to fall to the front")
    assert seen == sorted(seen, reverse=True) and len(seen) >= 2, seen
    assert eta_first not in ("—", "0 ms")
    page.screenshot(path=str(SHOTS / "queue-moving.png"), full_page=True)
    for thread in threads:
        thread.join(30)
    assert set(results) == set(ids)
    wait_until(lambda: page.locator("#queue-table tr.empty").count() == 1, what="the queue to empty in the page")
    assert charges_of(stack, last), "the gateway charged nothing for a completed request"
    page.wait_for_selector(f"#charges tr[data-id='{last}']", timeout=5000)
    assert page.locator("#card [data-field=charge]").count() == 1
    page.screenshot(path=str(SHOTS / "queue-charged.png"), full_page=True)


def test_member_of_another_tenant_sees_none_of_it(stack, browser):
    page = login(browser, stack, "bob", "bob-password-1")
    page.wait_for_selector("#live-status.on")
    results: dict = {}
    thread = send(stack, "alpha", "alpha-private-1", results)
    page.wait_for_timeout(1500)
    assert "alpha-private-1" not in page.content()
    page.fill("#watch-id", "alpha-private-1")
    page.click("#watch-form button")
    page.wait_for_selector("#card:not([hidden])")
    assert "No request alpha-private-1 of yours" in page.locator("#card").inner_text()
    thread.join(30)


def test_admin_changes_a_price_and_the_next_request_pays_it(stack, browser):
    page = login(browser, stack, "ada", "ada-password-1")
    page.goto(f"{stack.url}/console/policy/")
    row = page.locator("tr[data-class=BATCH]")
    row.locator("input[name=price_factor]").fill("2.5")
    row.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert "price ×2.5" in page.locator(".messages").inner_text()
    page.screenshot(path=str(SHOTS / "policy-price.png"), full_page=True)
    page.goto(f"{stack.url}/console/audit/?entity=class")
    assert "console:ada" in page.locator("#audit-table").inner_text()
    results: dict = {}
    send(stack, "beta", "after-price-1", results).join(30)
    headers = results["after-price-1"]
    [(amount, factor, base)] = charges_of(stack, "after-price-1")
    assert Decimal(factor) == Decimal("2.5") and Decimal(amount) == (Decimal(base) * Decimal("2.5")).quantize(Decimal("0.000001"))
    assert Decimal(headers["x-charge"].split()[0]) == Decimal(amount)


def test_admin_sees_operations_live(stack, browser):
    page = login(browser, stack, "ada", "ada-password-1")
    assert page.url.endswith("/console/ops/")
    page.wait_for_selector("#classes-table td:has-text('BATCH')", timeout=6000)
    page.wait_for_function("() => window.Chart !== undefined")
    page.screenshot(path=str(SHOTS / "operations.png"), full_page=True)
    page.goto(f"{stack.url}/console/finance/")
    page.wait_for_selector("#burn-table tbody tr")
    page.screenshot(path=str(SHOTS / "finance.png"), full_page=True)
