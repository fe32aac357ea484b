"""The simulator's answers on the wire: completion bodies and stream chunks.

One choice per prompt per ``n`` (indexes 0..choices-1). A choice may start with reasoning
(``reasoning_content``, as vLLM's reasoning parsers send it) and, for a request with ``tools``,
carries its text as the arguments of a call of the first tool (``{"text": "..."}``), streamed as
argument deltas after a first delta that names the function, as OpenAI and vLLM stream them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .protocol import CHAT, CompletionRequest, ResponseIdentity

ARGUMENTS_OPEN = '{"text":"'
ARGUMENTS_CLOSE = '"}'


@dataclass(frozen=True)
class Choice:
    """One choice's generated parts: its reasoning, then its text (a tool call's arguments' text)."""

    reasoning: str
    text: str


def call_id(ident: ResponseIdentity, index: int) -> str:
    return f"call-{ident.response_id}-{index}"


def _message(req: CompletionRequest, ident: ResponseIdentity, index: int, choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if req.tool is not None:
        arguments = ARGUMENTS_OPEN + choice.text + ARGUMENTS_CLOSE
        function = {"name": req.tool, "arguments": arguments}
        message["content"] = None
        message["tool_calls"] = [{"id": call_id(ident, index), "type": "function", "function": function}]
    if choice.reasoning:
        message["reasoning_content"] = choice.reasoning
    return message


def completion_body(
    req: CompletionRequest, ident: ResponseIdentity, choices: list[Choice], finish: str, usage: dict[str, int]
) -> bytes:
    if req.kind == CHAT:
        finish = "tool_calls" if req.tool is not None else finish
        bodies = [
            {"index": i, "message": _message(req, ident, i, c), "logprobs": None, "finish_reason": finish}
            for i, c in enumerate(choices)
        ]
        obj = "chat.completion"
    else:
        bodies = [
            {"index": i, "text": c.text, "logprobs": None, "finish_reason": finish} for i, c in enumerate(choices)
        ]
        obj = "text_completion"
    payload = {
        "id": ident.response_id,
        "object": obj,
        "created": ident.created,
        "model": ident.model,
        "choices": bodies,
        "usage": usage,
        "system_fingerprint": "fairgate-sim",
    }
    return json.dumps(payload).encode()


class ChunkEncoder:
    """Builds SSE event bytes for a stream; the fixed parts are encoded once per stream."""

    def __init__(self, req: CompletionRequest, ident: ResponseIdentity) -> None:
        self._chat = req.kind == CHAT
        self._tool = req.tool
        self._ident = ident
        self._calling: set[int] = set()  # choices whose tool call was named (its first delta sent)
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        self._head = (
            f'data: {{"id":{json.dumps(ident.response_id)},"object":"{obj}",'
            f'"created":{ident.created},"model":{json.dumps(ident.model)},"choices":'
        )
        self._tail = ',"usage":null}\n\n' if req.include_usage else "}\n\n"

    def _delta(self, index: int, delta: str) -> bytes:
        return (self._head + f'[{{"index":{index},"delta":{delta},"finish_reason":null}}]' + self._tail).encode()

    def start(self, index: int = 0) -> bytes:
        """A chat choice's first chunk: its role."""
        return self._delta(index, '{"role":"assistant","content":""}') if self._chat else b""

    def _arguments(self, text: str, index: int) -> bytes:
        """A delta of the choice's tool call: the first one names it (id, function, arguments' start)."""
        if index in self._calling:
            return self._delta(index, f'{{"tool_calls":[{{"index":0,"function":{{"arguments":{json.dumps(text)}}}}}]}}')
        self._calling.add(index)
        call = {"index": 0, "id": call_id(self._ident, index), "type": "function"}
        call["function"] = {"name": self._tool, "arguments": ARGUMENTS_OPEN + text}
        return self._delta(index, json.dumps({"tool_calls": [call]}, separators=(",", ":")))

    def reasoning(self, text: str, index: int = 0) -> bytes:
        return self._delta(index, f'{{"reasoning_content":{json.dumps(text)}}}') if text else b""

    def text(self, text: str, index: int = 0) -> bytes:
        if not text:
            return b""
        if self._tool is not None:
            return self._arguments(text, index)
        if self._chat:
            return self._delta(index, f'{{"content":{json.dumps(text)}}}')
        choice = f'[{{"index":{index},"text":{json.dumps(text)},"logprobs":null,"finish_reason":null}}]'
        return (self._head + choice + self._tail).encode()

    def finish(self, finish: str, index: int = 0) -> bytes:
        if not self._chat:
            choice = f'[{{"index":{index},"text":"","logprobs":null,"finish_reason":"{finish}"}}]'
            return (self._head + choice + self._tail).encode()
        close = b""
        if self._tool is not None:
            close, finish = self._arguments(ARGUMENTS_CLOSE, index), "tool_calls"
        choice = f'[{{"index":{index},"delta":{{}},"finish_reason":"{finish}"}}]'
        return close + (self._head + choice + self._tail).encode()

    def usage(self, usage: dict[str, int]) -> bytes:
        return (self._head + "[]" + f',"usage":{json.dumps(usage)}}}\n\n').encode()
