"""Parse and check an OpenAI request body; estimate its tokens.

Only what the gateway needs is checked (model, messages/prompt/input, stream, max_tokens,
max_completion_tokens, n, stream_options); every other field goes to the backend as the client
sent it. The output limit goes upstream as the hold covers it (gateway.limits). An embeddings
request has no output: it is held and charged for its input alone, and goes upstream as sent.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from django.conf import settings

from gateway.errors import invalid_request
from gateway.tokens import estimate_chat, estimate_completion

CHAT = "chat"
TEXT = "text"
EMBED = "embed"
UPSTREAM_PATHS = {CHAT: "/chat/completions", TEXT: "/completions", EMBED: "/embeddings"}
THREAD_ESTIMATE_BYTES = 64 * 1024  # longer prompts are tokenized off the event loop
LANE_THREAD_ESTIMATE_BYTES = 4 * 1024  # below the top class (gateway.lanes): from this length already


@dataclass
class Payload:
    kind: str
    body: dict
    raw: bytes
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None  # the client's output limit per choice (the smaller of the two fields)
    n: int
    max_tokens_field: str = "max_tokens"  # the field the client named it with
    prompt_tokens: int = 0  # cl100k_base estimate: scheduling
    prompt_bound: int = 0  # upper bound in any tokenizer: the hold (gateway.limits)
    output_limit: int = 0  # per choice, held and sent upstream (gateway.limits)

    @property
    def upstream_path(self) -> str:
        return UPSTREAM_PATHS[self.kind]

    @property
    def choices(self) -> int:
        """The choices the backend answers: ``n`` per prompt (a ``/v1/completions`` prompt list
        has one per prompt, as vLLM and OpenAI answer it)."""
        return self.n * (prompt_count(self.body.get("prompt")) if self.kind == TEXT else 1)


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


def prompt_count(prompt) -> int:
    """The prompts of a checked ``prompt``: a string or one array of token ids is one; an array of
    strings or of token-id arrays is one per item."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return len(prompt)
    return 1


def _check_prompt(prompt) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and (count := prompt_count(prompt)) > (cap := settings.FAIRGATE_MAX_PROMPTS):
        raise invalid_request(f"'prompt' has at most {cap} prompts here (FAIRGATE_MAX_PROMPTS); got {count}.")
    if (
        isinstance(prompt, list)
        and prompt
        and (
            all(isinstance(p, str) for p in prompt)
            or all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
            or all(
                isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt
            )
        )
    ):
        return
    raise invalid_request("'prompt' must be a string, an array of strings, or an array of token ids.")


def _is_tokens(value) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _check_input(value) -> None:
    """An embeddings ``input``: a string, or a non-empty array of strings, of token ids, or of
    arrays of token ids (OpenAI's four shapes), with no empty string and at most
    ``FAIRGATE_MAX_EMBEDDING_INPUTS`` items."""
    shape = "'input' must be a non-empty string, or an array of strings, of token ids, or of arrays of token ids."
    if isinstance(value, str):
        if not value:
            raise invalid_request(shape)
        return
    if not isinstance(value, list) or not value:
        raise invalid_request(shape)
    cap = settings.FAIRGATE_MAX_EMBEDDING_INPUTS
    if len(value) > cap:
        raise invalid_request(
            f"'input' has at most {cap} items here (FAIRGATE_MAX_EMBEDDING_INPUTS); got {len(value)}."
        )
    if all(isinstance(p, str) for p in value):
        if not all(value):
            raise invalid_request(shape)
        return
    if _is_tokens(value) or all(_is_tokens(p) for p in value):
        return
    raise invalid_request(shape)


def _embeddings_parse(body: dict, raw: bytes, model: str) -> Payload:
    _check_input(body.get("input"))
    if body.get("stream") not in (None, False):
        raise invalid_request("Embeddings are not streamed: leave 'stream' out.")
    return Payload(EMBED, body, raw, model, False, False, None, 1)


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
    if kind == EMBED:
        return _embeddings_parse(body, raw, model)
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
    max_tokens, field_name = _output_limit_asked(body, kind)
    n = _optional_int(body, "n", minimum=1) or 1
    include_usage = bool(stream and options and options.get("include_usage") is True)
    return Payload(kind, body, raw, model, bool(stream), include_usage, max_tokens, n, field_name)


def _limit_fields(kind: str) -> tuple[str, ...]:
    return ("max_tokens", "max_completion_tokens") if kind == CHAT else ("max_tokens",)


def _output_limit_asked(body: dict, kind: str) -> tuple[int | None, str]:
    """The smaller of the output limits the client named, and the field that named it."""
    asked = [
        (value, name) for name in _limit_fields(kind) if (value := _optional_int(body, name, minimum=1)) is not None
    ]
    return min(asked) if asked else (None, "max_tokens")


def estimate(payload: Payload) -> int:
    """Prompt tokens with cl100k_base (synchronous; `payload_estimate` is the event loop's)."""
    if payload.kind == CHAT:
        return estimate_chat(payload.body)
    return estimate_completion(payload.body["input" if payload.kind == EMBED else "prompt"])


async def payload_estimate(payload: Payload, *, in_lane: bool = False) -> int:
    """Prompt tokens with cl100k_base; long prompts are tokenized in a worker thread (tiktoken
    releases the GIL meanwhile), and a request in an intake lane's (``in_lane``) from a shorter
    length, so that the event loop stays free for the top class."""
    if len(payload.raw) > (LANE_THREAD_ESTIMATE_BYTES if in_lane else THREAD_ESTIMATE_BYTES):
        payload.prompt_tokens = await asyncio.to_thread(estimate, payload)
    else:
        payload.prompt_tokens = estimate(payload)
    return payload.prompt_tokens


def _limits_sent(payload: Payload) -> dict[str, int]:
    """The output-limit fields to send: the ones the client named (else ``max_tokens``), each at
    the limit the hold covers."""
    named = [name for name in _limit_fields(payload.kind) if payload.body.get(name) is not None]
    return {name: payload.output_limit for name in named or ["max_tokens"]}


def upstream_body(payload: Payload) -> bytes:
    """The body for the backend: as the client sent it, except that the output limit is the one
    held (``output_limit``, set by the gateway before this is called) and a stream always asks
    for usage. Re-encoded only when one of those changes it; embeddings never."""
    if payload.kind == EMBED:
        return payload.raw
    limits = _limits_sent(payload)
    add_usage = payload.stream and not payload.include_usage
    if not add_usage and all(payload.body.get(name) == value for name, value in limits.items()):
        return payload.raw
    body = {**payload.body, **limits}
    if add_usage:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()
