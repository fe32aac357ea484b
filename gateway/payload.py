"""Parse and check an OpenAI request body; estimate its tokens.

Only what the gateway needs is checked (model, messages/prompt, stream, max_tokens, n,
stream_options); every other field goes to the backend as the client sent it.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from gateway.errors import invalid_request
from gateway.tokens import estimate_chat, estimate_completion

CHAT = "chat"
TEXT = "text"
UPSTREAM_PATHS = {CHAT: "/chat/completions", TEXT: "/completions"}
THREAD_ESTIMATE_BYTES = 64 * 1024  # longer prompts are tokenized off the event loop


@dataclass
class Payload:
    kind: str
    body: dict
    raw: bytes
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int
    prompt_tokens: int = 0

    @property
    def upstream_path(self) -> str:
        return UPSTREAM_PATHS[self.kind]


def _optional_int(body: dict, name: str, *, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise invalid_request(f"'{name}' must be an integer of at least {minimum}.")
    return value


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise invalid_request("'messages' must be a non-empty array of {role, content} objects.")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid_request(f"'messages[{index}]' must be an object with a string 'role'.")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise invalid_request(f"'messages[{index}].content' must be a string, an array of parts, or null.")


def _check_prompt(prompt) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt and (
        all(isinstance(p, str) for p in prompt)
        or all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        or all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt)
    ):
        return
    raise invalid_request("'prompt' must be a string, an array of strings, or an array of token ids.")


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _decode(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise invalid_request("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise invalid_request("The request body must be a JSON object.")
    return body


def payload_parse(kind: str, raw: bytes) -> Payload:
    """The checked payload (without its token estimate), or GatewayError(400 invalid_request)."""
    body = _decode(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise invalid_request("'model' is required: name one of the models listed by GET /v1/models.")
    if kind == CHAT:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise invalid_request("'stream' must be true or false.")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid_request("'stream_options' must be an object.")
    max_tokens = _optional_int(body, "max_tokens", minimum=1)
    if kind == CHAT and max_tokens is None:
        max_tokens = _optional_int(body, "max_completion_tokens", minimum=1)
    n = _optional_int(body, "n", minimum=1) or 1
    include_usage = bool(stream and options and options.get("include_usage") is True)
    return Payload(kind, body, raw, model, bool(stream), include_usage, max_tokens, n)


def _estimate(payload: Payload) -> int:
    if payload.kind == CHAT:
        return estimate_chat(payload.body["messages"])
    return estimate_completion(payload.body["prompt"])


async def payload_estimate(payload: Payload) -> int:
    """Prompt tokens with cl100k_base; long prompts are tokenized in a worker thread."""
    if len(payload.raw) > THREAD_ESTIMATE_BYTES:
        payload.prompt_tokens = await asyncio.to_thread(_estimate, payload)
    else:
        payload.prompt_tokens = _estimate(payload)
    return payload.prompt_tokens


def upstream_body(payload: Payload) -> bytes:
    """The body for the backend: unchanged, except that a stream always asks for usage."""
    if not payload.stream or payload.include_usage:
        return payload.raw
    body = dict(payload.body)
    options = dict(body.get("stream_options") or {})
    options["include_usage"] = True
    body["stream_options"] = options
    return json.dumps(body, separators=(",", ":")).encode()
