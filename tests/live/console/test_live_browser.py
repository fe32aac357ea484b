"""The console in a real browser (Playwright driving Debian's Chromium) against the real
`manage.py serve` and a simulated GPU backend, with the official `openai` SDK as the client.
Screenshots go to artifacts/console/.

The tests wait for states, never for times: the backend's gate (``sim.gate``) holds the request
on its only slot until the test lets it through, so each step of the queue is a state the page
shows for as long as the test needs to see it. ``LIMIT_S`` and ``WAIT_MS`` are safety nets only."""

from __future__ import annotations

import io
import json
import re
from decimal import Decimal

import pytest

from tests.live.console.conftest import (
    LEDGER,
    LIMIT_S,
    SHOTS,
    held_at_backend,
    login,
    send,
)
from tests.support.livestack import (
    Gateway,
    wait_until,
)

pytestmark = pytest.mark.live


def cell(page, request_id: str, column: str) -> str | None:
    """The text of one cell of the request's row, or None without such a row (read at one instant)."""
    return page.evaluate(
        "([id, column]) => { const td = document.querySelector("
        "`#queue-table tr[data-id='${id}'] td.${column}`);"
        " return td ? (td.dataset.position ?? td.textContent) : null; }",
        [request_id, column],
    )


def card_field(page, field: str) -> str | None:
    """One field of the followed request's card, or None while the card does not show it."""
    return page.evaluate(
        "(field) => { const dd = document.querySelector(`#card [data-field='${field}']`);"
        " return dd ? dd.textContent : null; }",
        field,
    )


def table(page) -> list[tuple[str, str, str]]:
    """(id, state, position) of every row of the queue table, read at one instant."""
    return [
        tuple(row)
        for row in page.eval_on_selector_all(
            "#queue-table tbody tr[data-id]",
            "rows => rows.map(r => [r.dataset.id, r.children[3].textContent, "
            "r.querySelector('.position').dataset.position])",
        )
    ]


def shows(page, expected: list[tuple[str, str, str]], what: str) -> None:
    """Wait until the page's queue table is exactly ``expected`` (the live page is pushed to)."""
    seen: list = []

    def matches() -> bool:
        seen[:] = table(page)
        return seen == expected

    try:
        wait_until(matches, limit_s=LIMIT_S, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}: expected {expected}, the page showed {seen}") from None


def page_text_without_card(page) -> str:
    """The page's HTML but the followed-request card (which repeats the id typed into it)."""
    return page.evaluate(
        "() => { const b = document.body.cloneNode(true); b.querySelector('#card').remove(); return b.innerHTML; }"
    )


def charges_of(stack: Gateway, request_id: str) -> list[tuple[str, str, str]]:
    """(amount, factor, base cost) of the request's charge entries in the gateway's ledger."""
    return re.findall(r"CHARGE (\S+) (\S+) (\S+)", stack.shell(LEDGER.format(rid=request_id)))


def test_member_watches_position_and_eta_fall_then_the_charge(stack, gate, browser):
    page = login(browser, stack, "ann", "ann-password-1")
    assert page.url.endswith("/console/queue/")
    page.wait_for_selector("#live-status.on")
    results: dict = {}
    ids = [f"live-{i}" for i in range(4)]
    last = ids[-1]
    gate.close()
    threads = []
    for rid in ids:  # one after another, so their order in the queue is known
        threads.append(send(stack, "alpha", rid, results))
        page.wait_for_selector(f"#queue-table tr[data-id='{rid}']")
    # The first request has the backend's only slot and is held there; the others wait in the gateway.
    held_at_backend(gate)
    shows(
        page,
        [("live-0", "running", "—"), ("live-1", "queued", "1"), ("live-2", "queued", "2"), ("live-3", "queued", "3")],
        "the last request third in line",
    )
    page.fill("#watch-id", last)
    page.click("#watch-form button")

    def card_agrees(position: str) -> bool:
        return card_field(page, "state") == "queued" and card_field(page, "position") == position == cell(
            page, last, "position"
        )

    wait_until(lambda: card_agrees("3"), limit_s=LIMIT_S, what="the followed request's card to agree with its row")
    eta_first = cell(page, last, "eta")
    assert eta_first not in ("—", "0 ms", "running"), eta_first
    page.screenshot(path=str(SHOTS / "queue-waiting.png"), full_page=True)

    seen = [3]
    for step, ahead in enumerate((2, 1)):  # each request let through moves the last one up by one
        gate.allow(1)
        running = ids[step + 1]
        queued = [(rid, "queued", str(i + 1)) for i, rid in enumerate(ids[step + 2 :])]
        held_at_backend(gate)
        shows(page, [(running, "running", "—"), *queued], f"the last request at position {ahead}")
        wait_until(lambda ahead=ahead: card_agrees(str(ahead)), limit_s=LIMIT_S, what=f"the card at position {ahead}")
        assert cell(page, last, "eta") not in ("—", "0 ms", "running"), "a waiting request shows an ETA"
        seen.append(int(cell(page, last, "position")))
    assert seen == [3, 2, 1]
    page.screenshot(path=str(SHOTS / "queue-moving.png"), full_page=True)

    gate.allow(1)  # the third is let through: the last one reaches the backend and is held there
    held_at_backend(gate)
    shows(page, [(last, "running", "—")], "the last request running")
    assert cell(page, last, "eta") == "running"
    wait_until(
        lambda: card_field(page, "state") == "running", limit_s=LIMIT_S, what="the card to show the request running"
    )
    gate.open()
    for thread in threads:
        thread.join(LIMIT_S * 2)
    assert set(results) == set(ids)
    wait_until(
        lambda: page.locator("#queue-table tr.empty").count() == 1,
        limit_s=LIMIT_S,
        what="the queue to empty in the page",
    )
    assert charges_of(stack, last), "the gateway charged nothing for a completed request"
    page.wait_for_selector(f"#charges tr[data-id='{last}']")
    assert page.locator("#card [data-field=charge]").count() == 1
    page.screenshot(path=str(SHOTS / "queue-charged.png"), full_page=True)
    page.context.close()


def test_member_of_another_tenant_sees_none_of_it(stack, gate, browser):
    ann = login(browser, stack, "ann", "ann-password-1")  # a member of alpha, to see alpha's updates go out
    ann.wait_for_selector("#live-status.on")
    page = login(browser, stack, "bob", "bob-password-1")
    page.wait_for_selector("#live-status.on")
    results: dict = {}
    gate.close()
    alpha = send(stack, "alpha", "alpha-private-1", results)
    ann.wait_for_selector("#queue-table tr[data-id='alpha-private-1']")  # alpha's table with it is published
    held_at_backend(gate)
    beta = send(stack, "beta", "beta-own-1", results)
    # Bob's own request reaches his page in a later update than alpha's: anything leaked would be there by now.
    page.wait_for_selector("#queue-table tr[data-id='beta-own-1']")
    assert "alpha-private-1" not in page.content()
    page.fill("#watch-id", "alpha-private-1")  # live, held at the backend: still not bob's to see
    page.click("#watch-form button")
    page.wait_for_selector("#card:not([hidden]) p")
    assert "No request alpha-private-1 of yours" in page.locator("#card").inner_text()

    gate.allow(1)  # alpha's request finishes first, and its charge goes out to alpha's members
    alpha.join(LIMIT_S * 2)
    assert "alpha-private-1" in results
    ann.wait_for_selector("#charges tr[data-id='alpha-private-1']")
    gate.open()
    beta.join(LIMIT_S * 2)
    assert "beta-own-1" in results
    page.wait_for_selector("#charges tr[data-id='beta-own-1']")  # a later charge than alpha's
    assert "alpha-private-1" not in page_text_without_card(page)
    ann.context.close()
    page.context.close()


def test_admin_changes_a_price_and_the_next_request_pays_it(stack, browser):
    page = login(browser, stack, "ada", "ada-password-1")
    page.goto(f"{stack.url}/console/policy/")
    row = page.locator("tr[data-class=BATCH]")
    row.locator("input[name=price_factor]").fill("2.5")
    row.locator("button[type=submit]").click()
    page.wait_for_selector("#price-confirm")  # 0.7 → 2.5 moves it more than 2x: a confirm step first
    page.locator("#price-confirm button[type=submit]").click()
    page.wait_for_load_state()
    assert "price ×2.5" in page.locator("tr[data-class=BATCH] .feedback").inner_text()  # beside its field
    page.screenshot(path=str(SHOTS / "policy-price.png"), full_page=True)
    page.goto(f"{stack.url}/console/audit/?entity=class")
    assert "console:ada" in page.locator("#audit-table").inner_text()
    results: dict = {}
    send(stack, "beta", "after-price-1", results).join(LIMIT_S * 2)
    headers = results["after-price-1"]
    [(amount, factor, base)] = charges_of(stack, "after-price-1")
    assert Decimal(factor) == Decimal("2.5") and Decimal(amount) == (Decimal(base) * Decimal("2.5")).quantize(
        Decimal("0.000001")
    )
    assert Decimal(headers["x-charge"].split()[0]) == Decimal(amount)


def test_admin_sees_operations_live(stack, browser):
    page = login(browser, stack, "ada", "ada-password-1")
    assert page.url.endswith("/console/ops/")
    page.wait_for_selector("#classes-table td:has-text('BATCH')")
    page.wait_for_function("() => window.Chart !== undefined")
    page.screenshot(path=str(SHOTS / "operations.png"), full_page=True)
    page.goto(f"{stack.url}/console/finance/")
    page.wait_for_selector("#burn-table tbody tr")
    page.screenshot(path=str(SHOTS / "finance.png"), full_page=True)


def job_card(page, batch_id: str) -> str | None:
    """The text of the batch's card on the page, or None while there is none (read at one instant)."""
    return page.evaluate(
        "(id) => { const card = document.querySelector(`#batch-cards article[data-id='${id}']`);"
        " return card ? card.textContent : null; }",
        batch_id,
    )


def card_says(page, batch_id: str, *fragments: str, what: str) -> None:
    seen: list[str | None] = [None]

    def says() -> bool:
        seen[0] = job_card(page, batch_id)
        return seen[0] is not None and all(f in seen[0] for f in fragments)

    try:
        wait_until(says, limit_s=LIMIT_S, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}: the card showed {seen[0]!r}") from None


def test_member_follows_a_batch_job_card_live_and_cancels_it(stack, gate, browser):
    gate.close()
    sdk = stack.sdk("alpha")
    body = {"model": "m-one", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    lines = [{"custom_id": f"j{i}", "method": "POST", "url": "/v1/chat/completions", "body": body} for i in range(3)]
    upload = io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    batch = sdk.batches.create(
        input_file_id=sdk.files.create(file=("job.jsonl", upload), purpose="batch").id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    page = login(browser, stack, "ann", "ann-password-1")
    page.wait_for_selector("#live-status.on")
    held_at_backend(gate)  # its first line has the only slot, held at the backend; the others wait
    card_says(page, batch.id, "0 of 3 ended", "1 running · 2 waiting", "· running", what="the job's card, running")
    assert page.locator(f"#batch-cards article[data-id='{batch.id}'] button.danger").count() == 1
    page.screenshot(path=str(SHOTS / "batch-running.png"), full_page=True)

    page.locator(f"#batch-cards article[data-id='{batch.id}'] button.danger").click()
    page.wait_for_selector("#confirm")  # what cancelling stops, before it does
    assert "2 waiting lines never start" in page.locator("#confirm").text_content()
    page.click("#confirm-action")
    page.wait_for_selector(".messages")
    assert "no more of its lines start" in page.locator(".messages").text_content()
    card_says(
        page, batch.id, "cancelling", "2 cancelled", "1 running", what="the job cancelling, its running line left"
    )
    assert page.locator(f"#batch-cards article[data-id='{batch.id}'] button.danger").count() == 0
    gate.open()  # the running line finishes: the card moves without a reload
    # each line once, under its true state (issue 49: cancelled lines are not also "failed")
    card_says(page, batch.id, "3 of 3 ended (1 completed, 2 cancelled)", "cancelled", what="the job cancelled, live")
    assert "failed" not in (job_card(page, batch.id) or "")
    charged = re.search(r"Charged USD (\S+) of at most USD (\S+)", job_card(page, batch.id) or "")
    assert charged and 0 < Decimal(charged[1]) <= Decimal(charged[2].replace(",", "")), job_card(page, batch.id)
    page.screenshot(path=str(SHOTS / "batch-cancelled.png"), full_page=True)
    page.context.close()
