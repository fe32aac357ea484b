"""What a careless or hostile client asks for is held and charged whole: a /v1/completions prompt
list (one choice per prompt, as real servers answer it), tool definitions in the prompt estimate
(and its downgrade rule), and the tool-call and reasoning deltas of a stream it cut. Real
`serve`, simulated backends that answer as vLLM does, the official openai SDK."""

from __future__ import annotations

import json
from decimal import Decimal

import openai
import pytest

from gateway.tokens import count_text
from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

KEYS = {"acme": ("acme", "INTERACTIVE")}
LEDGER = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id={rid!r}).order_by("pk")
print(json.dumps([[e.kind, str(e.amount), str(e.unbilled), e.completion_tokens] for e in rows]))
"""
LONG_PROMPT_RULE = {
    "name": "long-prompt",
    "if": "class==INTERACTIVE and prompt_tokens>8000",
    "action": "DOWNGRADE_TO_NEAR_RT",
}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
CUT_AFTER_TOKENS = 1_200


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    plain = start_in_thread(SimConfig(port=0, slots=4, ttft_ms=1, tokens_per_s=100_000, seed=11))
    # a reasoning model that streams its tool calls slowly enough to be cut midway
    tools = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=1, tokens_per_s=1_000, reasoning_tokens=300, seed=12))
    yaml = scheduler_yaml(
        tenants=[tenant("acme")],
        backends=[backend("plain", f"{plain.url}/v1"), backend("tools", f"{tools.url}/v1", models=["tm"])],
        classes=("INTERACTIVE", "NEAR_RT", "BATCH"),
        downgrade_check=[LONG_PROMPT_RULE],
    )
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw-adversarial-tokens"),
        yaml,
        KEYS,
        FAIRGATE_MODEL_OUTPUT_LIMITS="m=40/1000,tm=40/4000",
        FAIRGATE_MAX_PROMPTS="60",
    )
    yield gateway
    gateway.stop()
    plain.stop()
    tools.stop()


def ledger(gateway, request_id: str) -> list[list]:
    return json.loads(gateway.shell(LEDGER.format(rid=request_id)).strip())


def charged(gateway, request_id: str) -> dict[str, list]:
    """The request's ledger entries by kind, once its charge is booked."""
    rows = wait_for(
        lambda: ledger(gateway, request_id),
        lambda rows: any(row[0] == "charge" for row in rows),
        what=f"{request_id} charged",
        limit_s=30,
    )
    return {row[0]: row[1:] for row in rows}


def test_a_prompt_list_is_held_for_every_choice_and_charged_whole(stack):
    prompts = [f"Prompt number {index}: say something." for index in range(50)]
    raw = stack.sdk("acme").completions.with_raw_response.create(
        model="m", prompt=prompts, max_tokens=20, extra_headers={"X-Request-Id": "list-50"}
    )
    answer = raw.parse()
    assert sorted(choice.index for choice in answer.choices) == list(range(50))  # one choice per prompt
    assert answer.usage.completion_tokens == 1_000
    entries = charged(stack, "acme/list-50")
    amount, unbilled, completion_tokens = entries["charge"]
    assert completion_tokens == 1_000 and Decimal(unbilled) == 0  # the hold covered all of it
    assert Decimal(amount) == Decimal(raw.headers["X-Charge"]) < Decimal(entries["hold"][0])


def test_a_prompt_list_above_the_cap_is_refused_before_anything_is_held(stack):
    with pytest.raises(openai.BadRequestError) as refused:
        stack.sdk("acme").completions.create(
            model="m", prompt=["hi"] * 61, max_tokens=5, extra_headers={"X-Request-Id": "list-61"}
        )
    assert refused.value.code == "invalid_request" and "at most 60" in refused.value.message
    assert ledger(stack, "acme/list-61") == []


def test_tool_definitions_count_toward_the_long_prompt_downgrade(stack):
    description = " ".join(["weather"] * 12_000)  # about 12k tokens of tool descriptions
    tools = [{"type": "function", "function": {"name": "forecast", "description": description, "parameters": {}}}]
    raw = stack.sdk("acme").chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        max_tokens=5,
        extra_headers={"X-Request-Id": "tools-12k"},
    )
    assert raw.headers["x-priority-downgraded"] == "INTERACTIVE; rule=long-prompt"
    assert raw.headers["x-priority-class"] == "NEAR_RT"


def test_a_cut_stream_of_reasoning_and_tool_call_deltas_is_charged_for_what_was_relayed(stack):
    stream = stack.sdk("acme").chat.completions.create(
        model="tm",
        messages=[{"role": "user", "content": "look it up"}],
        tools=[TOOL],
        max_tokens=4_000,
        stream=True,
        extra_headers={"X-Request-Id": "cut-tools"},
    )
    received: list[str] = []
    kinds: set[str] = set()
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            reasoning = (delta.model_extra or {}).get("reasoning_content")
            if reasoning:
                kinds.add("reasoning")
                received.append(reasoning)
            for call in delta.tool_calls or ():
                kinds.add("tool_calls")
                received += [call.function.name or "", call.function.arguments or ""]
            assert not delta.content
        if count_text("".join(received)) >= CUT_AFTER_TOKENS:
            break
    stream.close()  # the client leaves mid-stream
    relayed_tokens = count_text("".join(received))
    assert kinds == {"reasoning", "tool_calls"}
    entries = charged(stack, "acme/cut-tools")
    amount, unbilled, completion_tokens = entries["charge"]
    assert Decimal(amount) > 0 and Decimal(unbilled) == 0
    assert relayed_tokens * 0.95 <= completion_tokens < 4_000  # what was relayed, not the whole answer
