"""Company sign-in against a real OpenID provider (npm `oidc-provider`, tests/support/oidc_provider.mjs)
on 127.0.0.1, in Debian's Chromium: a member of a mapped group signs in and sees that tenant's queue
and no other; a user in no mapped group is refused with a page naming whom to ask; logout ends the
session at Fairgate and at the provider; a changed rule applies at the next sign-in."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.live.console.conftest import WAIT_MS, YAML
from tests.support.livestack import REPO_ROOT, Gateway, free_port, start_gateway, stop_process, wait_until

PROVIDER_JS = REPO_ROOT / "tests" / "support" / "oidc_provider.mjs"
CLIENT_ID, CLIENT_SECRET = "fairgate-console", "provider-test-secret"
ACCOUNTS = {
    "ann": {"email": "ann@example.com", "name": "Ann Alpha", "groups": ["staff", "llm-alpha"]},
    "zed": {"email": "zed@example.com", "name": "Zed Nobody", "groups": ["staff"]},
}
RULES_ALPHA = "signin:\n  rules:\n    - {value: llm-alpha, tenant: alpha, role: member}\n"
RULES_BETA = "signin:\n  rules:\n    - {value: llm-alpha, tenant: beta, role: member}\n"


@pytest.fixture(scope="module")
def provider_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def stack(sim, tmp_path_factory, provider_port) -> Iterator[Gateway]:
    """The console with the provider configured (it is asked for its endpoints at the first sign-in)."""
    var_dir = tmp_path_factory.mktemp("console-signin")
    gateway = start_gateway(
        var_dir,
        YAML % {"url": f"{sim.url}/v1", "service": 1000},
        {"alpha": ("alpha", "BATCH")},
        FAIRGATE_OIDC_ISSUER=f"http://127.0.0.1:{provider_port}",
        FAIRGATE_OIDC_CLIENT_ID=CLIENT_ID,
        FAIRGATE_OIDC_CLIENT_SECRET=CLIENT_SECRET,
        FAIRGATE_SIGNIN_CONTACT="the LLM platform team (llm-platform@example.com)",
    )
    rules = var_dir / "signin.yaml"
    rules.write_text(RULES_ALPHA)
    assert "loaded 1 sign-in rule" in gateway.manage("signin", "load", str(rules))
    gateway.extra["rules"] = rules
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def provider(stack, provider_port, tmp_path_factory) -> Iterator[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is missing: the OpenID provider of this test runs on Node.js (apt-get install nodejs)")
    config = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uri": f"{stack.url}/console/sso/callback/",
        "post_logout_redirect_uri": f"{stack.url}/console/login/",
        "accounts": ACCOUNTS,
    }
    log_path = tmp_path_factory.mktemp("provider") / "provider.log"
    process = subprocess.Popen(
        [node, str(PROVIDER_JS), str(provider_port), json.dumps(config)],
        cwd=REPO_ROOT,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
    )
    issuer = f"http://127.0.0.1:{provider_port}"

    def discovered() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(discovered, limit_s=60, what="the OpenID provider")
    yield issuer
    stop_process(process)


def sign_in(browser, stack: Gateway, login: str):
    """A fresh browser signs in at the provider as ``login``; returns the page back at Fairgate."""
    page = browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{stack.url}/console/")
    page.click("#sso-login")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password: the provider's development form")
    page.click("button.login-submit")
    page.wait_for_load_state()
    if not page.url.startswith(stack.url):  # the provider's consent step
        page.click("button.login-submit")
    page.wait_for_url(f"{stack.url}/**")
    page.wait_for_load_state()
    return page


def test_member_of_a_mapped_group_sees_its_tenant_only(browser, stack, provider):
    page = sign_in(browser, stack, "ann")
    assert page.url.startswith(f"{stack.url}/console/queue/")
    assert "sso-ann" in page.inner_text("header .who")
    assert "alpha" in page.inner_text("header .who")
    page.goto(f"{stack.url}/console/queue/?tenant=beta")  # a member's queue is always their own
    assert "alpha" in page.inner_text("main")
    assert "Beta" not in page.inner_text("main")
    refused = page.goto(f"{stack.url}/console/finance/")
    assert refused is not None and refused.status == 403
    page.context.close()


def test_user_in_no_mapped_group_is_refused_with_whom_to_ask(browser, stack, provider):
    page = sign_in(browser, stack, "zed")
    assert page.url == f"{stack.url}/console/sso/refused/"
    text = page.inner_text("#signin-refused")
    assert "no group that Fairgate maps" in text
    assert "staff" in text
    assert "llm-platform@example.com" in text
    page.goto(f"{stack.url}/console/queue/")
    assert page.url.startswith(f"{stack.url}/console/login/")  # not signed in
    page.context.close()


def test_logout_ends_the_session_here_and_at_the_provider(browser, stack, provider):
    page = sign_in(browser, stack, "ann")
    page.click("form.logout button")
    page.wait_for_load_state()
    assert page.url.startswith(f"{provider}/session/end")  # RP-initiated logout at the provider
    page.click("button[name=logout]")
    page.wait_for_url(f"{stack.url}/console/login/**")
    page.goto(f"{stack.url}/console/queue/")
    assert page.url.startswith(f"{stack.url}/console/login/")
    page.click("#sso-login")  # the provider's session ended too: it asks for the login again
    page.wait_for_selector("input[name=login]")
    page.context.close()


def test_a_changed_rule_applies_at_the_next_sign_in(browser, stack, provider):
    stack.extra["rules"].write_text(RULES_BETA)
    try:
        assert "loaded 1 sign-in rule" in stack.manage("signin", "load", str(stack.extra["rules"]))
        page = sign_in(browser, stack, "ann")
        assert "beta" in page.inner_text("header .who")
        page.context.close()
    finally:
        stack.extra["rules"].write_text(RULES_ALPHA)
        stack.manage("signin", "load", str(stack.extra["rules"]))
