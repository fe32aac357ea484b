"""The console's words and dead ends in a real browser, on a desktop and on a 390 x 844 phone:
a refused change said beside its field where the eye is, target waits in minutes, the login that
keeps the username, a 404 page in words, / leading to the console, another department's (idle) queue."""

from __future__ import annotations

import pytest

from tests.live.console.conftest import SHOTS, WAIT_MS

pytestmark = pytest.mark.live

VIEWPORTS = {"desktop": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}


@pytest.fixture(params=sorted(VIEWPORTS))
def screen(request, browser):
    context = browser.new_context(viewport=VIEWPORTS[request.param])
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    yield request.param, page
    context.close()


IN_VIEW = (
    "(sel) => { const n = document.querySelector(sel); if (!n) return false;"
    " const r = n.getBoundingClientRect(); return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight"
    " && r.left >= 0 && r.right <= window.innerWidth; }"
)


def test_plain_words_and_no_dead_ends(stack, screen):
    name, page = screen
    page.goto(f"{stack.url}/")
    assert "/console/login/" in page.url  # / leads to the console, which asks to log in
    page.fill("input[name=username]", "ada")
    page.fill("input[name=password]", "not-her-password")
    page.click("#login")
    page.wait_for_selector("p.error")
    assert page.input_value("input[name=username]") == "ada"  # only the password is typed again
    page.fill("input[name=password]", "ada-password-1")
    page.click("#login")
    page.wait_for_load_state()

    page.goto(f"{stack.url}/console/policy/")
    row = page.locator("tr#class-BATCH")
    assert row.locator("td.sla").inner_text() == "2"  # 120,000 ms, shown in minutes
    assert "Batch" in row.locator("td").first.inner_text()
    row.locator("input[name=price_factor]").scroll_into_view_if_needed()
    row.locator("input[name=price_factor]").fill("-0.5")
    row.locator("button[type=submit]").click()
    page.wait_for_selector("tr#class-BATCH .feedback.error")
    assert "Refused" in page.locator("tr#class-BATCH .feedback").inner_text()
    page.wait_for_function(IN_VIEW, arg="tr#class-BATCH .feedback")  # beside the field, on screen
    page.screenshot(path=str(SHOTS / f"policy-refused-{name}.png"))

    page.goto(f"{stack.url}/console/no-such-page/")
    text = page.locator("main").inner_text()
    assert "Nothing here" in text and "Resolver404" not in text

    page.goto(f"{stack.url}/console/queue/?tenant=alpha")
    assert page.locator("h1").inner_text().startswith("Queue — Alpha")
    page.wait_for_function(  # an idle department: said as soon as the socket is up, not "waiting" forever
        "() => document.querySelector('#job-cards').textContent.includes('No requests in the last hour')"
    )
    page.click("#spend-link")  # the department's month of charges, by class, key and job
    assert page.locator("h1").inner_text().startswith("Spend — Alpha") and page.locator("#spend-total").is_visible()
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"), "no sideways scroll"
