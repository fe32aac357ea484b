"""The gate of the simulated GPU backend: held requests wait for the controller, not for a clock.

Each test waits for states (requests held at the gate, answers arrived); the time limits are
safety nets only. The HTTP tests serve the simulator in a background thread, as the live tests do.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from simbackend import Gate, RunningSim

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
FAST = dict(ttft_ms=1, tokens_per_s=10_000)
LIMIT_S = 30.0

StartSim = Callable[..., RunningSim]
live = pytest.mark.live


def wait_until(predicate: Callable[[], object], what: str) -> object:
    deadline_s = time.monotonic() + LIMIT_S
    while not (value := predicate()):
        assert time.monotonic() < deadline_s, f"{what} never held"
        time.sleep(0.01)
    return value


def stats(sim: RunningSim) -> dict:
    return httpx.get(f"{sim.url}/stats").json()


class Call:
    """One chat completion in a thread of its own; ``done`` once its answer (or error) is in."""

    def __init__(self, sim: RunningSim, body: dict | None = None) -> None:
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.answered_at_s: float | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sim.url, body or CHAT_BODY), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict) -> None:
        try:
            self.response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S)
            self.answered_at_s = time.monotonic()
        except BaseException as err:  # reported by result()
            self.error = err
        finally:
            self.done.set()

    def result(self) -> httpx.Response:
        assert self.done.wait(LIMIT_S), "the request was never answered"
        assert self.error is None, self.error
        assert self.response is not None and self.response.status_code == 200, self.response
        return self.response


# --- the gate alone, on an event loop of its own ---------------------------------------------


def test_the_gate_is_open_by_default() -> None:
    gate = Gate()
    assert gate.is_open and gate.waiting == 0 and gate.try_pass()
    asyncio.run(asyncio.wait_for(gate.passage(), LIMIT_S))
    gate.allow(3)  # no effect while open
    assert gate.credits == 0 and gate.state() == {"open": True, "waiting": 0, "credits": 0}
    with pytest.raises(ValueError):
        gate.allow(-1)


def test_a_closed_gate_releases_in_order_what_another_thread_allows() -> None:
    gate = Gate()
    gate.close()
    passed: list[int] = []
    steps: list[tuple[int, list[int]]] = []

    async def main() -> None:
        async def one(i: int) -> None:
            await gate.passage()
            passed.append(i)

        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(one(i)))
            while gate.waiting < i + 1:  # arrive in a known order
                await asyncio.sleep(0)

        def controller() -> None:  # another thread, as a test drives the simulator
            for expected in (1, 2):
                gate.allow(1)
                wait_until(lambda expected=expected: len(passed) == expected, f"{expected} let through")
                steps.append((gate.waiting, list(passed)))
            gate.open()

        await asyncio.gather(asyncio.to_thread(controller), *tasks)

    asyncio.run(asyncio.wait_for(main(), LIMIT_S))
    assert steps == [(2, [0]), (1, [0, 1])]
    assert passed == [0, 1, 2] and gate.waiting == 0 and gate.is_open


def test_allow_before_arrival_lets_the_next_ones_pass_and_close_drops_credits() -> None:
    gate = Gate()
    gate.close()
    gate.allow(2)
    assert gate.credits == 2
    assert gate.try_pass() and gate.try_pass() and not gate.try_pass()
    gate.allow(1)
    gate.close()
    assert gate.credits == 0 and not gate.try_pass()


def test_a_held_request_cancelled_leaves_the_gate_and_passes_its_turn_on() -> None:
    gate = Gate()
    gate.close()

    async def main() -> None:
        first = asyncio.create_task(gate.passage())
        second = asyncio.create_task(gate.passage())
        while gate.waiting < 2:
            await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert gate.waiting == 1
        gate.allow(1)
        await second
        third = asyncio.create_task(gate.passage())
        while gate.waiting < 1:
            await asyncio.sleep(0)
        gate.allow(1)  # released, then cancelled before it ran: the turn goes to the next one
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        assert gate.credits == 1

    asyncio.run(asyncio.wait_for(main(), LIMIT_S))


# --- in the simulator, over HTTP -------------------------------------------------------------


@live
def test_a_closed_gate_holds_an_admitted_request_until_allowed(start_sim: StartSim) -> None:
    sim = start_sim(slots=2, fixed_latency_ms=50)
    sim.gate.close()
    call = Call(sim)
    wait_until(lambda: sim.gate.waiting == 1, "the request held at the gate")
    held = stats(sim)
    assert held["in_flight"] == 1 and held["completed"] == 0, "a held request keeps its slot"
    assert not call.done.is_set()
    allowed_at_s = time.monotonic()
    sim.gate.allow(1)
    response = call.result()
    assert response.json()["usage"]["completion_tokens"] == 4
    assert call.answered_at_s - allowed_at_s >= 0.05, "the service time starts when let through"
    assert sim.gate.waiting == 0 and stats(sim)["completed"] == 1


@live
def test_allow_before_arrival_lets_that_many_through_as_they_come(start_sim: StartSim) -> None:
    sim = start_sim(slots=2, **FAST)
    sim.gate.close()
    sim.gate.allow(1)
    Call(sim).result()
    assert sim.gate.credits == 0
    second = Call(sim)
    wait_until(lambda: sim.gate.waiting == 1, "the second request held")
    sim.gate.allow(1)
    second.result()


@live
def test_open_releases_every_held_request_and_all_later_ones(start_sim: StartSim) -> None:
    sim = start_sim(slots=4, **FAST)
    sim.gate.close()
    calls = [Call(sim) for _ in range(3)]
    wait_until(lambda: sim.gate.waiting == 3, "three requests held")
    assert stats(sim)["in_flight"] == 3
    sim.gate.open()
    for call in calls:
        call.result()
    Call(sim).result()
    assert sim.gate.waiting == 0 and stats(sim)["completed"] == 4


@live
def test_the_default_gate_holds_nothing(start_sim: StartSim) -> None:
    sim = start_sim(slots=1, **FAST)
    assert sim.gate.is_open and sim.gate.waiting == 0
    for _ in range(3):
        Call(sim).result()
    assert httpx.get(f"{sim.url}/gate").json() == {"open": True, "waiting": 0, "credits": 0}


@live
def test_a_held_stream_sends_no_byte_before_it_is_let_through(start_sim: StartSim) -> None:
    sim = start_sim(slots=1, **FAST)
    sim.gate.close()
    started = threading.Event()
    chunks: list[bytes] = []

    def stream() -> None:
        with httpx.stream(
            "POST", f"{sim.url}/v1/chat/completions", json={**CHAT_BODY, "stream": True}, timeout=LIMIT_S
        ) as response:
            started.set()
            chunks.extend(response.iter_bytes())

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    wait_until(lambda: sim.gate.waiting == 1, "the stream held")
    assert stats(sim)["in_flight"] == 1
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=CHAT_BODY).status_code == 429, "its slot is taken"
    assert not started.is_set(), "the response started before the gate let it through"
    sim.gate.allow(1)
    reader.join(LIMIT_S)
    assert started.is_set() and b"".join(chunks).rstrip().endswith(b"data: [DONE]")


@live
def test_a_client_leaving_while_held_frees_its_slot(start_sim: StartSim) -> None:
    sim = start_sim(slots=1, **FAST)
    sim.gate.close()
    body = httpx.Request("POST", f"{sim.url}/v1/chat/completions", json=CHAT_BODY)
    with socket.create_connection((sim.host, sim.port), timeout=LIMIT_S) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body.content)}\r\n\r\n".encode()
            + body.content
        )
        wait_until(lambda: sim.gate.waiting == 1, "the request held")
    wait_until(lambda: sim.gate.waiting == 0 and stats(sim)["in_flight"] == 0, "the slot freed")
    assert stats(sim)["cancelled"] == 1
    sim.gate.allow(1)  # the turn was not used by the one that left: the next request passes
    Call(sim).result()


@live
def test_the_gate_is_driven_over_http_too(start_sim: StartSim) -> None:
    sim = start_sim(slots=2, **FAST)
    with httpx.Client(base_url=sim.url, timeout=LIMIT_S) as http:
        assert http.post("/gate", json={"action": "close"}).json() == {"open": False, "waiting": 0, "credits": 0}
        call = Call(sim)
        wait_until(lambda: http.get("/gate").json()["waiting"] == 1, "the request held")
        assert http.post("/gate", json={"action": "allow", "n": 2}).json() == {
            "open": False,
            "waiting": 0,
            "credits": 1,
        }
        call.result()
        assert http.post("/gate", json={"action": "open"}).json()["open"] is True
        for bad in ({"action": "ajar"}, {"action": "allow", "n": -1}, {"action": "allow", "n": "2"}, [1]):
            reply = http.post("/gate", json=bad)
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_gate_action"
        assert http.put("/gate").status_code == 405
