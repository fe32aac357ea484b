"""Every part of a request is estimated and every choice held; every part of a relayed stream is
counted when the client cuts it (gateway.tokens, gateway.limits, gateway.proxy.SseFilter)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest

from batches.lines import LineRefused, lines_parse
from gateway import admission, charging
from gateway.auth import Caller
from gateway.errors import GatewayError
from gateway.intake import Asked
from gateway.lifecycle import PublicId
from gateway.limits import output_limit, output_tokens_held
from gateway.payload import CHAT, TEXT, estimate, payload_parse
from gateway.proxy import SseFilter, answer_text
from gateway.tokens import count_json, count_text, estimate_chat

USER = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city, today and for the next days. " * 20,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _parsed(kind: str, body: dict):
    payload = payload_parse(kind, json.dumps(body).encode())
    payload.output_limit = output_limit(payload)
    return payload


def test_tool_definitions_legacy_functions_and_schemas_are_estimated():
    bare = estimate_chat({"messages": [USER]})
    assert estimate_chat({"messages": [USER], "tools": TOOLS}) == bare + count_json(TOOLS) > bare + 200
    functions = [tool["function"] for tool in TOOLS]
    assert estimate_chat({"messages": [USER], "functions": functions}) == bare + count_json(functions)
    schema = {"name": "answer", "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    with_schema = {"messages": [USER], "response_format": {"type": "json_schema", "json_schema": schema}}
    assert estimate_chat(with_schema) == bare + count_json(schema)
    assert estimate_chat({"messages": [USER], "response_format": {"type": "json_object"}}) == bare


def test_every_kind_of_message_is_estimated():
    arguments = json.dumps({"city": "Paris " * 50})
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    conversation = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}], "name": "house"},
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees. " * 30},
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": arguments}},
    ]
    total = estimate_chat({"messages": conversation})
    assert total >= 2 * count_text(arguments) + count_text("Sunny, 24 degrees. " * 30) + count_text("Be brief.")
    without_calls = [{k: v for k, v in m.items() if k not in ("tool_calls", "function_call")} for m in conversation]
    assert total - estimate_chat({"messages": without_calls}) >= 2 * count_text(arguments)


def test_the_gateway_estimates_a_chat_request_whole():
    payload = _parsed(CHAT, {"model": "m", "messages": [USER], "tools": TOOLS})
    assert estimate(payload) == estimate_chat(payload.body) > estimate_chat({"messages": [USER]})


@pytest.mark.parametrize(
    "prompt, prompts",
    [("one", 1), ([1, 2, 3], 1), (["a", "b", "c"], 3), ([[1], [2, 3]], 2)],
)
def test_a_completion_is_held_for_each_prompt_and_each_choice(settings, prompt, prompts):
    settings.FAIRGATE_DEFAULT_MAX_TOKENS = 30
    payload = _parsed(TEXT, {"model": "m", "prompt": prompt, "max_tokens": 20, "n": 2})
    assert payload.choices == 2 * prompts
    assert output_tokens_held(payload) == 20 * 2 * prompts
    chat = _parsed(CHAT, {"model": "m", "messages": [USER], "n": 3})
    assert output_tokens_held(chat) == 30 * 3


def test_a_prompt_list_above_the_cap_is_refused(settings):
    settings.FAIRGATE_MAX_PROMPTS = 3
    _parsed(TEXT, {"model": "m", "prompt": ["a"] * 3})
    for prompt in (["a"] * 4, [[1]] * 4):
        with pytest.raises(GatewayError) as refused:
            _parsed(TEXT, {"model": "m", "prompt": prompt})
        assert refused.value.status == 400 and "at most 3 prompts" in refused.value.message
    _parsed(TEXT, {"model": "m", "prompt": [7] * 10})  # token ids of one prompt


def _batch_line(prompt) -> bytes:
    body = {"model": "m", "prompt": prompt, "max_tokens": 20, "n": 2}
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}).encode()


def test_a_batch_line_is_held_as_an_http_request_is(settings, monkeypatch):
    settings.FAIRGATE_MAX_PROMPTS = 50
    with pytest.raises(LineRefused) as refused:
        lines_parse([_batch_line(["p"] * 51)], endpoint="/v1/completions", served={"m": False})
    assert refused.value.line == 1 and "at most 50 prompts" in refused.value.message
    (line,) = lines_parse([_batch_line(["p"] * 50)], endpoint="/v1/completions", served={"m": False})
    assert line.terms.output_tokens == 20 * 2 * 50  # what the batch's forecast holds for it

    asked_hold: dict = {}
    admitted: list = []

    async def hold(**what):
        asked_hold.update(what)
        return charging.Hold("t", "t/a", "BATCH", "m", 1, 1, amount=Decimal("1"), factor=Decimal("1"))

    class Engine:
        def now_ms(self) -> int:
            return 0

        async def admit(self, request, **_):
            admitted.append(request)
            return object()

    monkeypatch.setattr(charging, "hold", hold)
    caller = Caller("t", 1, False, (), "BATCH", "fg_x")
    asked = Asked(Engine(), caller, PublicId("a"), line.payload, "BATCH", "BATCH", None, None)  # type: ignore[arg-type]
    asyncio.run(admission.admit(asked, early=False))
    assert asked_hold["max_output_tokens"] == admitted[0].expected_output_tokens == 20 * 2 * 50


def _event(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_a_cut_stream_counts_reasoning_tool_calls_and_every_choice():
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "Think first."}}]},
        {"choices": [{"index": 1, "delta": {"reasoning": "Other."}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty":"Paris"}'}}]}}]},
        {"choices": [{"index": 1, "delta": {"function_call": {"name": "f", "arguments": "{}"}}}]},
        {"choices": [{"index": 1, "delta": {"content": " Done."}}]},
    ]
    sse = SseFilter(forward_usage=False)
    for event in events:
        sse.feed(_event(event))
    assert sse.text_sent() == 'Think first.Other.get_weather{"city":"Paris"}f{} Done.'
    completions = SseFilter(forward_usage=False)
    completions.feed(_event({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}))
    assert completions.text_sent() == "ab"


def test_a_whole_answer_without_usage_counts_every_choice_its_reasoning_and_tool_calls():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    answer = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]}},
            {"index": 1, "message": {"role": "assistant", "reasoning_content": "Hm.", "content": " Sunny."}},
        ]
    }
    assert answer_text(json.dumps(answer).encode()) == 'get_weather{"city":"Paris"} Sunny.Hm.'
    assert answer_text(json.dumps({"choices": [{"text": "a"}, {"text": "b"}]}).encode()) == "ab"
    assert answer_text(b"not json") == answer_text(b"[1]") == ""
