"""Each persona's main task in a real browser (its own stack: conftest.py): a member follows an
HTTP job by its progress bar; finance finds a department's class shift and premium after a price
change; then a screenshot of every console page at desktop (1280 px) and phone (390 px) widths.

Every step waits for a state the page shows (the backend's gate holds the job's requests until
the test lets them through); ``LIMIT_S`` is a safety net only."""

from __future__ import annotations

import re
import threading
from decimal import Decimal

import pytest

from tests.live.console.conftest import LIMIT_S, SHOTS, WAIT_MS, held_at_backend, login
from tests.support.livestack import Gateway, wait_until

pytestmark = pytest.mark.live
WIDTHS = {"desktop": 1280, "phone": 390}
CHARGES = """
from billing.models import LedgerEntry
print("COUNT", LedgerEntry.objects.filter(kind="charge", tenant__slug={slug!r}).count())
"""
PRICE = """
from decimal import Decimal
from scheduling.models import PriorityClass
from billing.price_versions import price_set
price_set(priority_class=PriorityClass.objects.get(name={cls!r}), price_factor=Decimal({factor!r}), actor="test")
"""


def send_job(stack: Gateway, key: str, request_id: str, *, job: str | None, cls: str, results: dict):
    def run() -> None:
        headers = {"X-Request-Id": request_id, "X-Priority-Class": cls}
        if job:
            headers["X-Job-Id"] = job
        raw = stack.sdk(key, timeout=LIMIT_S * 2).chat.completions.with_raw_response.create(
            model="m-one", messages=[{"role": "user", "content": "hello"}], max_tokens=8, extra_headers=headers
        )
        results[request_id] = raw.headers

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def charges_count(stack: Gateway, slug: str) -> int:
    found = re.search(r"COUNT (\d+)", stack.shell(CHARGES.format(slug=slug)))
    return int(found[1]) if found else -1


def job_field(page, job: str, name: str) -> str | None:
    return page.evaluate(
        "([job, name]) => { const n = document.querySelector("
        "`#job-cards article[data-job='${job}'] [data-field='${name}']`); return n ? n.textContent : null; }",
        [job, name],
    )


def progress(page, job: str) -> dict[str, str | None]:
    """The job card's counts and its bar's done width, read at one instant."""
    return {name: job_field(page, job, name) for name in ("done", "failed", "running", "waiting", "total", "eta")} | {
        "bar": page.evaluate(
            "(job) => { const s = document.querySelector("
            "`#job-cards article[data-job='${job}'] .bar span[data-part='done']`); return s ? s.style.width : null; }",
            job,
        )
    }


def card_shows(page, job: str, expected: dict[str, str], what: str) -> None:
    seen: dict = {}

    def matches() -> bool:
        seen.update(progress(page, job))
        return all(seen.get(k) == v for k, v in expected.items())

    try:
        wait_until(matches, limit_s=LIMIT_S, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}: expected {expected}, the card showed {seen}") from None


def test_member_follows_a_job_by_its_progress_bar(stack, gate, browser):
    page = login(browser, stack, "ann", "ann-password-1")
    page.wait_for_selector("#live-status.on")
    gate.close()
    results: dict = {}
    ids = [f"rep-{i}" for i in range(4)]
    threads = []
    for rid in ids:
        threads.append(send_job(stack, "alpha", rid, job="report-7", cls="BATCH", results=results))
        page.wait_for_selector(f"#queue-table tr[data-id='{rid}']")  # in order: positions are known
    held_at_backend(gate)
    card_shows(
        page,
        "report-7",
        {"done": "0", "running": "1", "waiting": "3", "total": "4", "bar": "0%"},
        "the job's card with one running, three waiting",
    )
    api = page.evaluate("() => fetch('/console/api/queue/').then(r => r.json())")
    [job] = [j for j in api["jobs"] if j["job"] == "report-7"]
    said = job_field(page, "report-7", "eta") or ""
    if job["eta_confidence"] == "measured":  # an estimate where the engine has measured the class
        assert said.startswith("about ") or said.startswith("by "), said
    else:  # and an honest word where it has not yet (BATCH's first requests on this stack)
        assert job["eta_confidence"] == "prior" and said == "no estimate yet: first requests of this class today", said
    last_position = page.locator("#queue-table tr[data-id='rep-3'] td.position").text_content() or ""
    assert re.fullmatch(r"\d+(st|nd|rd|th) in line, 3rd of yours in BATCH", last_position), last_position
    page.screenshot(path=str(SHOTS / "job-running.png"), full_page=True)
    page.set_viewport_size({"width": WIDTHS["phone"], "height": 900})
    page.wait_for_function(f"() => document.documentElement.scrollWidth <= {WIDTHS['phone']}")
    page.screenshot(path=str(SHOTS / "job-running-phone.png"), full_page=True)
    page.set_viewport_size({"width": WIDTHS["desktop"], "height": 1000})
    for done in (1, 2, 3):  # let one through at a time: the bar grows by a quarter each
        gate.allow(1)
        card_shows(page, "report-7", {"done": str(done), "bar": f"{25 * done}%"}, f"{done} of 4 done")
    gate.open()
    for thread in threads:
        thread.join(LIMIT_S * 2)
    assert set(results) == set(ids)
    card_shows(
        page,
        "report-7",
        {"done": "4", "failed": "0", "running": "0", "waiting": "0", "bar": "100%", "eta": "finished"},
        "the job finished",
    )
    wait_until(
        lambda: Decimal((job_field(page, "report-7", "charged") or "USD 0").split()[-1].replace(",", "")) > 0,
        limit_s=LIMIT_S,
        what="the job's charges",
    )
    api = page.evaluate("() => fetch('/console/api/queue/').then(r => r.json())")
    [job] = [j for j in api["jobs"] if j["job"] == "report-7"]
    assert (job["done"], job["total"], job["eta_ms"]) == (4, 4, None)
    page.screenshot(path=str(SHOTS / "job-done.png"), full_page=True)
    page.context.close()


def _traffic(stack: Gateway, plan: list[tuple[str, int]], tag: str) -> None:
    """beta's requests, one class after another, each waited for (the gate is open)."""
    results: dict = {}
    n = 0
    for cls, count in plan:
        for _ in range(count):
            n += 1
            send_job(stack, "beta", f"{tag}-{n}", job=None, cls=cls, results=results).join(LIMIT_S * 2)
    assert len(results) == n


def test_finance_finds_the_class_shift_and_premium_after_a_price_change(stack, browser):
    _traffic(stack, [("INTERACTIVE", 3), ("BATCH", 1)], "before")
    wait_until(lambda: charges_count(stack, "beta") == 4, limit_s=LIMIT_S, what="beta's first charges booked")
    stack.shell(PRICE.format(cls="INTERACTIVE", factor="2"))
    _traffic(stack, [("INTERACTIVE", 1), ("BATCH", 3)], "after")
    wait_until(lambda: charges_count(stack, "beta") == 8, limit_s=LIMIT_S, what="beta's later charges booked")

    page = login(browser, stack, "fay", "fay-password-1")
    assert page.url.endswith("/console/finance/")
    row = page.locator("#shift-table tr[data-tenant=beta]")
    row.locator("td[data-period='1']").wait_for()
    before, after = (row.locator(f"td[data-period='{p}'] .share").text_content() for p in (0, 1))
    assert (before, after) == ("75 %", "25 %")
    premium = row.locator("td[data-period='0'] .premium").text_content() or ""
    assert Decimal(premium.split()[-1].replace(",", "")) > 0, premium  # INTERACTIVE at 1.6: paid above compute cost
    heads = page.locator("#shift-table thead th").all_text_contents()
    assert any("INTERACTIVE 1.6 → 2" in h for h in heads), heads
    page.select_option("#f-tenant", "beta")  # the story for one department: its own shares
    page.click("#filters button[type=submit]")
    wait_until(
        lambda: "75 % (premium" in (page.locator("#shift-story").text_content() or ""),
        limit_s=LIMIT_S,
        what="beta's story",
    )
    assert "→ 2: 25 % (premium" in (page.locator("#shift-story").text_content() or "")
    factors = page.eval_on_selector_all("#charges-table tbody tr", "rows => rows.map(r => r.children[8].textContent)")
    assert "1.6" in factors and "0.7" in factors and not [f for f in factors if f.endswith("00")], factors
    row.click()
    page.locator("#shift-detail:not([hidden])").wait_for()
    page.locator("#burn-multiples figure[data-tenant=beta]").wait_for()
    page.screenshot(path=str(SHOTS / "finance-incentive.png"), full_page=True)
    page.context.close()


PAGES = [
    ("ann", "ann-password-1", "queue", "/console/queue/", "#job-cards article"),
    ("fay", "fay-password-1", "finance", "/console/finance/", "#shift-table tbody tr"),
    ("ada", "ada-password-1", "operations", "/console/ops/", "#timeline-table tbody tr td + td"),
    ("ada", "ada-password-1", "policy", "/console/policy/", "tr[data-class=BATCH]"),
    ("ada", "ada-password-1", "audit", "/console/audit/", "#audit-table"),
    ("ada", "ada-password-1", "tenant-picker", "/console/queue/", ".picker"),
    ("ada", "ada-password-1", "admin-queue", "/console/queue/?tenant=alpha", "#job-cards article"),
    ("ann", "ann-password-1", "refused", "/console/policy/", ".refusal"),
    ("ann", "ann-password-1", "not-found", "/console/nowhere/", "main"),
]


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_screenshots_of_every_page(stack, browser, width):
    """After the tasks above (their data on the pages); each page once its live part has arrived."""
    context = browser.new_context(viewport={"width": WIDTHS[width], "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{stack.url}/console/login/")
    page.screenshot(path=str(SHOTS / f"login-{width}.png"), full_page=True)
    context.close()
    for user, password, name, path, ready in PAGES:
        page = login(browser, stack, user, password)
        page.set_viewport_size({"width": WIDTHS[width], "height": 900})
        page.goto(f"{stack.url}{path}")
        page.locator(ready).first.wait_for()
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
        page.context.close()
        assert overflow <= 0, f"{name} at {width}: {overflow} px wider than the screen"
