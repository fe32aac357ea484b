"""Configuration reaching the running dispatcher, and the fifo preset's behaviour at the gateway."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.live.gateway.conftest import sim_stats
from tests.support.livestack import wait_until

pytestmark = pytest.mark.live
CHAT = [{"role": "user", "content": "hello"}]


def test_a_backend_added_by_command_is_served_without_restart(tight, sims):
    with tight.http("beta") as http:
        assert "m-two" not in {m["id"] for m in http.get("/v1/models").json()["data"]}
        tight.manage(
            "backend", "create", "b-two", "--url", f"{sims['main'].url}/v1", "--model", "m-two", "--slots", "2"
        )
        wait_until(
            lambda: "m-two" in {m["id"] for m in http.get("/v1/models").json()["data"]},
            limit_s=5,
            what="new backend visible",
        )
    answer = tight.sdk("beta").chat.completions.create(model="m-two", messages=CHAT, max_tokens=2)
    assert answer.usage.completion_tokens == 2


def test_fifo_preset_still_serves_a_request_whose_client_left(fifo):
    """The old gateway's waste, reproduced for the surge comparison: nobody reads the answer."""
    client = fifo.sdk("beta")
    blocker = threading.Thread(
        target=lambda: client.chat.completions.create(
            model="m-one", messages=CHAT, max_tokens=1, extra_headers={"X-Request-Id": "fifo-block"}
        )
    )
    blocker.start()
    with fifo.http("beta") as http:
        wait_until(lambda: http.get("/v1/queue/fifo-block").json().get("state") == "running", what="running")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{fifo.url}/v1/chat/completions",
            timeout=0.25,
            headers={"Authorization": f"Bearer {fifo.keys['beta']}", "X-Request-Id": "fifo-gone"},
            json={"model": "m-one", "messages": CHAT, "max_tokens": 1},
        )
    blocker.join()
    with fifo.http("beta") as http:
        record = wait_until(
            lambda: (r := http.get("/v1/queue/fifo-gone").json()).get("state") == "cancelled" and r,
            what="orphan served",
        )
    assert record["backend"] == "b-one"
    assert sim_stats(fifo.extra["sim"], request_id="fifo-gone")["seen"] is True
