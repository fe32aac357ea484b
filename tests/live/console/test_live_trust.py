"""Issue 49 in a real browser (Debian's Chromium) against the real stack: one screen answers "where
is my job, when will it be done, what did it cost" for a running batch and for a tagged HTTP job,
on a desktop and on a 390 x 844 phone; a batch is one card (never also an untagged job); a client
that gave up is a failure with its reason in words, linked to "Follow one request"; money is in
the configured currency; finance's class mix for all departments is the ledger's.

Screenshots go to artifacts/console/ (ignored); with FAIRGATE_SCREENSHOTS set (``make
screenshots``) the queue, finance and policy pages are written there instead (docs/screenshots/).
Every step waits for a state the page shows; ``LIMIT_S`` is a safety net only."""

from __future__ import annotations

import io
import json
import os
import socket
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.live.console.conftest import LIMIT_S, SHOTS, WAIT_MS, held_at_backend, login
from tests.live.console.test_live_personas import send_job
from tests.support.livestack import Gateway, wait_until

pytestmark = pytest.mark.live
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 1000}
DOCS_SHOTS = os.environ.get("FAIRGATE_SCREENSHOTS")


def given_up_later(stack: Gateway, key: str, request_id: str, job: str) -> socket.socket:
    """A chat request on a raw connection that the test closes when it likes: the client gives up."""
    url = urlparse(stack.url)
    body = json.dumps({"model": "m-one", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {stack.keys[key]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nX-Request-Id: {request_id}\r\n"
        f"X-Job-Id: {job}\r\nX-Priority-Class: BATCH\r\n\r\n"
    )
    sock = socket.create_connection((url.hostname, url.port), timeout=LIMIT_S)
    sock.sendall(head.encode() + body)
    return sock


def text_of(page, selector: str) -> str:
    return page.evaluate("(s) => { const n = document.querySelector(s); return n ? n.textContent : ''; }", selector)


def three_answers(page, selector: str) -> dict[str, str]:
    """Where (the card), when (its ETA) and what it cost (its money), as the card shows them."""
    return {
        "where": text_of(page, selector + " h3"),
        "when": text_of(page, selector + " [data-field='eta']"),
        "cost": text_of(page, selector + " [data-field='charged']")
        or text_of(page, selector + " [data-field='money']"),
    }


def answered(answers: dict[str, str]) -> bool:
    return bool(answers["where"]) and answers["when"] not in ("", "—") and "USD " in answers["cost"]


def no_sideways_scroll(page) -> int:
    return page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")


def shot(page, name: str) -> None:
    folder = Path(DOCS_SHOTS) if DOCS_SHOTS else SHOTS
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def test_one_screen_answers_where_when_and_cost_for_a_batch_and_a_job(stack, gate, browser):
    gate.close()
    sdk = stack.sdk("alpha")
    body = {"model": "m-one", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    lines = [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body} for i in range(3)]
    upload = io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    batch = sdk.batches.create(
        input_file_id=sdk.files.create(file=("trust.jsonl", upload), purpose="batch").id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"description": "Weekly ticket summaries"},
    )
    page = login(browser, stack, "ann", "ann-password-1")
    page.wait_for_selector("#live-status.on")
    held_at_backend(gate)  # a line of the batch holds the only slot
    results: dict = {}
    threads = [send_job(stack, "alpha", f"job-{i}", job="invoices-3", cls="BATCH", results=results) for i in range(2)]
    page.wait_for_selector("#queue-table tr[data-id='job-1']")
    quitter = given_up_later(stack, "alpha", "job-quits", "invoices-3")
    page.wait_for_selector("#queue-table tr[data-id='job-quits']")

    batch_card = f"#batch-cards article[data-id='{batch.id}']"
    job_card = "#job-cards article[data-job='invoices-3']"
    page.wait_for_selector(job_card)
    wait_until(lambda: "Weekly ticket summaries" in text_of(page, batch_card), limit_s=LIMIT_S, what="its description")
    for card in (batch_card, job_card):
        wait_until(lambda card=card: answered(three_answers(page, card)), limit_s=LIMIT_S, what=f"{card} answers")
    # one piece of work, one card: the batch's lines are not also an untagged job
    assert page.locator("#job-cards article[data-job^='key/']").count() == 0, text_of(page, "#job-cards")
    line_job = f"#queue-table tr[data-id='{batch.id}.3'] td[data-label='Job']"
    assert text_of(page, line_job) == f"batch {batch.id}", text_of(page, line_job)  # its batch, not "untagged"
    line_eta = text_of(page, f"#queue-table tr[data-id='{batch.id}.3'] td.eta")
    if line_eta.startswith("no estimate"):  # the card and its lines tell one story: no figure the engine lacks
        wait_until(
            lambda: text_of(page, batch_card + " [data-field='eta']") == line_eta,
            limit_s=LIMIT_S,
            what=f"the batch card saying {line_eta!r} as its waiting lines do",
        )
    assert "USD " in text_of(page, "#budget-spent") and "000000" not in text_of(page, "#budget")
    shot(page, "queue-desktop" if DOCS_SHOTS else "trust-queue-desktop")

    page.set_viewport_size(PHONE)  # the same answers on a phone, nothing sideways
    page.wait_for_function(f"() => document.documentElement.scrollWidth <= {PHONE['width']}")
    for card in (batch_card, job_card):
        assert answered(three_answers(page, card)), three_answers(page, card)
    row = page.locator("#queue-table tr[data-id='job-1']")
    for cell in ("td.position", "td.eta"):
        box = row.locator(cell).bounding_box()
        assert box and box["width"] > 0 and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (cell, box)
    blank = page.eval_on_selector_all(  # a row's height beyond its last line of content
        "#queue-table tbody tr[data-id]",
        "rows => rows.map(r => r.getBoundingClientRect().bottom - Math.max(...Array.from(r.children)"
        ".filter(td => td.offsetParent).map(td => td.getBoundingClientRect().bottom)))",
    )
    assert blank and max(blank) <= 10, blank  # no row taller than its content
    assert no_sideways_scroll(page) <= 0
    shot(page, "queue-phone" if DOCS_SHOTS else "trust-queue-phone")
    page.set_viewport_size(DESKTOP)

    quitter.close()  # the client gives up while queued: a failure, in words, linked to its request
    wait_until(
        lambda: "the client gave up" in text_of(page, job_card + " details.failures summary"),
        limit_s=LIMIT_S,
        what="the job card saying why one failed",
    )
    page.locator(job_card + " details.failures summary").click()
    page.locator(job_card + " a[data-follow='job-quits']").click()
    wait_until(
        lambda: "the client gave up" in text_of(page, "#card [data-field='why-it-ended']"),
        limit_s=LIMIT_S,
        what="Follow one request saying why it ended",
    )
    gate.open()
    for thread in threads:
        thread.join(LIMIT_S * 2)
    assert set(results) == {"job-0", "job-1"}
    wait_until(lambda: "3 of 3 ended (3 completed)" in text_of(page, batch_card), limit_s=LIMIT_S, what="batch done")
    # the engine's optional ETA fields (range, confidence, slip), as a card renders them: drawn and
    # read in one turn of the page, so no push comes between
    shown = page.evaluate(
        """() => {
        const base = {label: "x", tagged: true, classes: ["BATCH"], total: 5, done: 1, failed: 0, running: 1,
          waiting: 3, charged: "0.054522", estimated_total: "0.2655", estimate_basis: "mean so far",
          failed_by_reason: [], failures: []};
        const cards = [
          Object.assign({job: "ranged", eta_ms: 120000, eta_upper_ms: 240000, eta_confidence: "measured"}, base),
          Object.assign({job: "prior", eta_ms: 30000, eta_upper_ms: 60000, eta_confidence: "prior"}, base),
          Object.assign({job: "slipped", eta_ms: 300000, eta_upper_ms: 600000, eta_confidence: "measured",
            eta_slip_reason: "fair_share", eta_first_at_ms: Date.now() - 60000}, base),
        ];
        JobCards.render(cards);
        const field = (job, name) => (document.querySelector(
          `#job-cards article[data-job='${job}'] [data-field='${name}']`) || {}).textContent || "";
        return {ranged: field("ranged", "eta"), prior: field("prior", "eta"), slipped: field("slipped", "slip"),
          charged: field("ranged", "charged"), estimate: field("ranged", "estimate")};
      }"""
    )
    assert shown["ranged"] == "about 2–4 min", shown
    assert shown["prior"] == "no estimate yet: first requests of this class today", shown
    assert shown["slipped"].startswith("Later than first shown") and "fair turns" in shown["slipped"], shown
    assert (shown["charged"], shown["estimate"]) == ("USD 0.05", "about USD 0.27 (from the mean charge so far)"), shown
    charged = text_of(page, batch_card + " [data-field='money']")
    assert charged.startswith("Charged USD ") and Decimal(charged.split()[2].replace(",", "")) > 0, charged
    page.context.close()


def test_finance_class_mix_for_all_is_the_ledgers_and_prices_mark_the_time_axis(stack, browser):
    results: dict = {}
    for i, cls in enumerate(["INTERACTIVE", "INTERACTIVE", "BATCH"]):
        send_job(stack, "beta", f"mix-{i}", job=None, cls=cls, results=results).join(LIMIT_S * 2)
    assert len(results) == 3
    page = login(browser, stack, "fay", "fay-password-1")
    page.wait_for_function("() => window.Finance && Finance.mixChart() && Finance.shareChart()")
    chart = page.evaluate(
        "() => { const c = Finance.mixChart(); return {labels: c.data.labels,"
        " sets: c.data.datasets.map(d => [d.label, d.data])}; }"
    )
    api = page.evaluate("() => fetch('/api/billing/class-mix/').then(r => r.json())")
    expected = {(r["month"], r["class"]): float(Decimal(r["request_share"]) * 100) for r in api["overall"]}
    shown = {(m, cls): v for cls, data in chart["sets"] for m, v in zip(chart["labels"], data, strict=True)}
    assert expected and {k: round(v, 2) for k, v in shown.items() if k in expected} == {
        k: round(v, 2) for k, v in expected.items()
    }
    ledger = stack.shell(
        "from billing.models import LedgerEntry as L\n"
        "q = L.objects.filter(kind='charge')\n"
        "print('SHARE', q.filter(class_name='INTERACTIVE').count(), q.count())"
    )
    top, total = (int(x) for x in ledger.split("SHARE")[1].split())
    months = sorted({m for m, _ in expected})
    if len(months) == 1:  # all of the ledger in one month: the chart's share is the ledger's
        assert round(shown[(months[0], "INTERACTIVE")], 2) == round(100 * top / total, 2)
    assert no_sideways_scroll(page) <= 0
    shot(page, "finance-desktop" if DOCS_SHOTS else "trust-finance-desktop")
    page.set_viewport_size(PHONE)
    page.wait_for_function(f"() => document.documentElement.scrollWidth <= {PHONE['width']}")
    page.context.close()

    page = login(browser, stack, "ada", "ada-password-1")
    page.goto(f"{stack.url}/console/policy/")
    page.locator("tr[data-class=BATCH]").first.wait_for(timeout=WAIT_MS)
    shot(page, "policy-desktop" if DOCS_SHOTS else "trust-policy-desktop")
    page.context.close()
