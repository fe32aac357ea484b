"""The simulated GPU backend, served over real HTTP, with httpx and the official openai SDK.

No Django: the server runs in a background thread (uvicorn) on a free port per test.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simbackend import RunningSim, SimConfig
from simbackend.model import Capacity, SlidingWindow, plan_service

REPO_ROOT = Path(__file__).resolve().parents[3]
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
WAIT_LIMIT_S = 10.0

StartSim = Callable[..., RunningSim]


def sdk(sim: RunningSim) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="sim", max_retries=0, timeout=30)


def stats(sim: RunningSim, **params: str) -> dict:
    return httpx.get(f"{sim.url}/stats", params=params).json()


def wait_for_stats(sim: RunningSim, predicate: Callable[[dict], bool]) -> dict:
    """Poll /stats until the predicate holds (bounded; the server updates asynchronously)."""
    deadline_s = time.monotonic() + WAIT_LIMIT_S
    while not predicate(current := stats(sim)):
        assert time.monotonic() < deadline_s, f"stats never matched: {current}"
        time.sleep(0.02)
    return current


# --- served over HTTP -----------------------------------------------------------------------

live = pytest.mark.live


@live
def test_chat_and_text_completions_report_usage(start_sim: StartSim) -> None:
    client = sdk(start_sim(ttft_ms=1, tokens_per_s=10_000))
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi " * 40}], max_tokens=7)
    assert chat.object == "chat.completion"
    assert chat.choices[0].finish_reason == "length"
    assert len(chat.choices[0].message.content.split()) == 7
    assert chat.usage.completion_tokens == 7
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + 7
    text = client.completions.create(model="m", prompt="x" * 400, max_tokens=3)
    assert text.object == "text_completion"
    assert text.usage.prompt_tokens == 101 and text.usage.completion_tokens == 3
    default = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert default.usage.completion_tokens == 64 and default.choices[0].finish_reason == "stop"


@live
def test_embeddings_are_deterministic_unit_vectors_in_either_encoding(start_sim: StartSim) -> None:
    sim = start_sim(ttft_ms=1)
    client = sdk(sim)
    floats = client.embeddings.create(model="m", input=["alpha", "beta"], encoding_format="float", dimensions=6)
    decoded = client.embeddings.create(model="m", input=["alpha", "beta"], dimensions=6)  # the SDK asks for base64
    assert [len(item.embedding) for item in floats.data] == [6, 6]
    for plain, packed in zip(floats.data, decoded.data):
        assert plain.embedding == pytest.approx(packed.embedding, rel=1e-6)  # float32 on the wire
        assert sum(v * v for v in plain.embedding) == pytest.approx(1.0)
    assert floats.data[0].embedding != floats.data[1].embedding
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == 4
    refused = httpx.post(f"{sim.url}/v1/embeddings", json={"model": "m", "input": "a", "dimensions": 0})
    assert refused.status_code == 400


@live
def test_prompt_tokens_grow_with_prompt_and_text_is_deterministic(start_sim: StartSim) -> None:
    fast = dict(ttft_ms=1, tokens_per_s=10_000)
    first, same_seed, other_seed = sdk(start_sim(**fast)), sdk(start_sim(**fast)), sdk(start_sim(seed=2, **fast))

    def ask(client: openai.OpenAI, content: str) -> tuple[str, int]:
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": content}], max_tokens=20
        )
        return reply.choices[0].message.content, reply.usage.prompt_tokens

    short_text, short_tokens = ask(first, "short")
    _, long_tokens = ask(first, "long " * 500)
    assert long_tokens > short_tokens + 400
    assert ask(same_seed, "short") == (short_text, short_tokens)
    assert ask(other_seed, "short")[0] != short_text


@live
def test_stream_with_include_usage_ends_with_usage_chunk(start_sim: StartSim) -> None:
    client = sdk(start_sim(ttft_ms=5, tokens_per_s=2_000))
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 50
    assert chunks[-2].choices[0].finish_reason == "length"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 50
    assert sum(1 for c in chunks if c.usage is not None) == 1


@live
def test_stream_without_include_usage_has_no_usage(start_sim: StartSim) -> None:
    sim = start_sim(ttft_ms=5, tokens_per_s=500)
    chunks = list(
        sdk(sim).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(chunks) >= 4  # role, several text events (paced), finish
    text = list(sdk(sim).completions.create(model="m", prompt="p", max_tokens=5, stream=True))
    assert len("".join(c.choices[0].text for c in text).split()) == 5
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json={**CHAT_BODY, "stream": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


@live
def test_beyond_slots_answers_429_with_retry_after(start_sim: StartSim) -> None:
    slots = 3
    sim = start_sim(slots=slots, fixed_latency_ms=1_500)

    async def fire(count: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=CHAT_BODY) for _ in range(count)))

    responses = asyncio.run(fire(slots + 4))
    rejected = [r for r in responses if r.status_code == 429]
    assert sum(r.status_code == 200 for r in responses) >= slots
    assert rejected, "no request was refused beyond the slots"
    assert all(int(r.headers["retry-after"]) >= 1 for r in rejected)
    assert rejected[0].json()["error"]["code"] == "rate_limit_exceeded"
    after = stats(sim)
    assert after["max_in_flight"] == slots and after["rejected_slots"] == len(rejected)


@live
def test_held_slots_make_the_sdk_raise_rate_limit_and_disconnect_frees_them(start_sim: StartSim) -> None:
    sim = start_sim(slots=2, ttft_ms=1, tokens_per_s=5)
    body = {**CHAT_BODY, "stream": True, "max_tokens": 500}
    with httpx.Client(base_url=sim.url, timeout=30) as http, ExitStack() as held:
        for _ in range(2):
            assert held.enter_context(http.stream("POST", "/v1/chat/completions", json=body)).status_code == 200
        with pytest.raises(openai.RateLimitError) as caught:
            sdk(sim).chat.completions.create(model="m", messages=CHAT_BODY["messages"], max_tokens=1)
        assert caught.value.code == "rate_limit_exceeded"
        assert caught.value.response.headers["x-sim-reject-reason"] == "slots"
    wait_for_stats(sim, lambda s: s["in_flight"] == 0 and s["cancelled"] == 2)
    assert sdk(sim).chat.completions.create(model="m", messages=CHAT_BODY["messages"], max_tokens=1).usage


@live
def test_client_leaving_a_non_streamed_request_frees_its_slot(start_sim: StartSim) -> None:
    sim = start_sim(slots=1, fixed_latency_ms=5_000)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/chat/completions", json=CHAT_BODY, timeout=0.3)
    assert wait_for_stats(sim, lambda s: s["in_flight"] == 0)["cancelled"] == 1


@live
def test_tokens_per_minute_limit_answers_429(start_sim: StartSim) -> None:
    sim = start_sim(tpm=100, ttft_ms=1, tokens_per_s=10_000)
    client = sdk(sim)
    messages = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="m", messages=messages, max_tokens=60).usage.total_tokens <= 100
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=messages, max_tokens=60)
    assert caught.value.response.headers["x-sim-reject-reason"] == "tpm"
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert client.chat.completions.create(model="m", messages=messages, max_tokens=5).usage  # still fits
    assert stats(sim)["rejected_tpm"] == 1


@live
def test_requests_per_minute_limit_answers_429(start_sim: StartSim) -> None:
    sim = start_sim(rpm=2, ttft_ms=1, tokens_per_s=10_000)
    codes = [httpx.post(f"{sim.url}/v1/chat/completions", json=CHAT_BODY).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


@live
def test_fail_rate_one_answers_500(start_sim: StartSim) -> None:
    sim = start_sim(fail_rate=1.0)
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(sim).chat.completions.create(model="m", messages=CHAT_BODY["messages"])
    assert caught.value.status_code == 500 and caught.value.code == "simulated_failure"
    assert stats(sim)["failed"] == 1


@live
def test_fail_rate_is_seeded(start_sim: StartSim) -> None:
    def pattern(sim: RunningSim) -> list[int]:
        return [
            httpx.post(f"{sim.url}/v1/completions", json={"model": "m", "prompt": "p"}).status_code for _ in range(20)
        ]

    fast = dict(fail_rate=0.5, seed=7, ttft_ms=0, tokens_per_s=100_000)
    first = pattern(start_sim(**fast))
    assert first == pattern(start_sim(**fast))
    assert set(first) == {200, 500}


@live
@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_request"),
        (b'{"model": "m"}', "invalid_request"),
        (b'{"model": "m", "messages": [], "max_tokens": 3}', "invalid_request"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "invalid_request"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "invalid_request"),
    ],
)
def test_bad_input_answers_400_openai_shaped(start_sim: StartSim, body: bytes, code: str) -> None:
    sim = start_sim()
    resp = httpx.post(f"{sim.url}/v1/chat/completions", content=body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]


@live
def test_models_restriction_and_routes(start_sim: StartSim) -> None:
    sim = start_sim(models=("alpha", "beta"), ttft_ms=1, tokens_per_s=10_000)
    client = sdk(sim)
    assert [m.id for m in client.models.list()] == ["alpha", "beta"]
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gamma", messages=CHAT_BODY["messages"])
    assert caught.value.code == "model_not_found"
    assert client.chat.completions.create(model="beta", messages=CHAT_BODY["messages"]).model == "beta"
    assert httpx.get(f"{sim.url}/nope").json()["error"]["code"] == "not_found"
    assert httpx.get(f"{sim.url}/v1/completions").status_code == 405
    assert httpx.get(f"{sim.url}/healthz").json() == {"status": "ok"}


@live
def test_stats_record_request_ids_and_reset(start_sim: StartSim) -> None:
    sim = start_sim(ttft_ms=1, tokens_per_s=10_000)
    for request_id in ("req-a", "req-b"):
        httpx.post(f"{sim.url}/v1/chat/completions", json=CHAT_BODY, headers={"X-Request-Id": request_id})
    httpx.post(f"{sim.url}/v1/chat/completions", content=b"{bad", headers={"X-Request-Id": "req-bad"})
    seen = stats(sim, request_id="req-b")
    assert seen["recent_request_ids"] == ["req-a", "req-b", "req-bad"] and seen["seen"] is True
    assert seen["requests"] == 3 and seen["completed"] == 2 and seen["bad_requests"] == 1
    assert seen["completion_tokens"] == 16
    assert stats(sim, request_id="req-never")["seen"] is False
    httpx.post(f"{sim.url}/stats/reset")
    assert stats(sim)["requests"] == 0 and stats(sim)["recent_request_ids"] == []


@live
def test_planned_service_time_follows_prompt_and_output_size(start_sim: StartSim) -> None:
    sim = start_sim(ttft_ms=10, tokens_per_s=1_000)

    def service_ms(content: str, max_tokens: int) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
        return int(httpx.post(f"{sim.url}/v1/chat/completions", json=body).headers["x-sim-service-ms"])

    assert service_ms("hi", 100) > service_ms("hi", 10)
    assert service_ms("x" * 20_000, 10) > service_ms("hi", 10)
    fixed = start_sim(fixed_latency_ms=50)
    assert httpx.post(f"{fixed.url}/v1/chat/completions", json=CHAT_BODY).headers["x-sim-service-ms"] == "50"


def test_command_line_serves_and_rejects_bad_options() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "simbackend", "--port", str(port), "--slots", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline_s = time.monotonic() + WAIT_LIMIT_S
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/stats").json()["slots"] == 2
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline_s, "CLI server did not start"
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=WAIT_LIMIT_S)
    bad = subprocess.run([*cmd[:3], "--fail-rate", "2"], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--fail-rate" in bad.stderr


# --- the model, without a server -----------------------------------------------------------


def test_plan_scales_prefill_with_prompt_and_decode_with_output() -> None:
    config = SimConfig(ttft_ms=100, tokens_per_s=50)
    assert plan_service(config, prompt_tokens=100, completion_tokens=50).total_ms == 100 + 1000
    assert plan_service(config, prompt_tokens=1024, completion_tokens=0).prefill_ms == 200
    fixed = SimConfig(fixed_latency_ms=50)
    assert plan_service(fixed, prompt_tokens=9999, completion_tokens=9999).total_ms == 50


def test_full_slots_retry_after_points_at_the_soonest_finish() -> None:
    config = SimConfig(slots=2, ttft_ms=100, tokens_per_s=10)
    capacity = Capacity(config)
    long_plan = plan_service(config, prompt_tokens=1, completion_tokens=20)
    short_plan = plan_service(config, prompt_tokens=1, completion_tokens=0)
    assert capacity.try_admit(1, long_plan, now_ms=0) is None
    assert capacity.try_admit(2, short_plan, now_ms=0) is None
    rejection = capacity.try_admit(3, short_plan, now_ms=40)
    assert rejection is not None and rejection.reason == "slots" and rejection.retry_after_ms == 60
    capacity.release(2)
    assert capacity.try_admit(3, short_plan, now_ms=40) is None


def test_window_wait_is_until_enough_tokens_expire() -> None:
    window = SlidingWindow(limit=100, window_ms=60_000)
    window.add(30, now_ms=0)
    window.add(50, now_ms=10_000)
    assert window.wait_ms_for(20, now_ms=20_000) == 0
    assert window.wait_ms_for(40, now_ms=20_000) == 40_000  # the first 30 expire at 60 s
    assert window.wait_ms_for(90, now_ms=20_000) == 50_000  # both must expire
    assert window.wait_ms_for(101, now_ms=20_000) == 60_000  # never fits: a whole window
    assert window.used(now_ms=60_000) == 50


@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(1, 60)), max_size=60))
def test_admitted_tokens_never_exceed_the_limit_in_any_window(steps: list[tuple[int, int]]) -> None:
    window = SlidingWindow(limit=100, window_ms=60_000)
    now_ms, admitted = 0, []
    for gap_ms, amount in steps:
        now_ms += gap_ms
        if window.wait_ms_for(amount, now_ms) == 0:
            window.add(amount, now_ms)
            admitted.append((now_ms, amount))
    for start_ms, _ in admitted:
        in_window = sum(a for t, a in admitted if start_ms <= t < start_ms + 60_000)
        assert in_window <= 100
