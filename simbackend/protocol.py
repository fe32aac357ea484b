"""OpenAI wire format for the simulator: request parsing, token counting, embeddings bodies
(completion bodies and stream chunks: simbackend.answer).

Token counts are rough but deterministic (about four characters per token plus a small
per-message overhead; tool definitions count as their JSON); the gateway does its own estimate
with tiktoken. A request is answered ``n`` choices per prompt (a ``/v1/completions`` prompt list
has one prompt per item), as vLLM and OpenAI answer; a chat request with ``tools`` (and no
``tool_choice`` "none") is answered with a call of its first tool.
"""

from __future__ import annotations

import base64
import json
import math
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Any

CHAT = "chat"
TEXT = "text"
EMBED = "embed"
EMBEDDING_DIMENSIONS = 16  # the simulator's vectors, unless the request asks for ``dimensions``
MAX_EMBEDDING_DIMENSIONS = 4096
CHAT_OVERHEAD_TOKENS = 3
MESSAGE_OVERHEAD_TOKENS = 4
FILLER_WORDS = (
    "the",
    "queue",
    "moves",
    "fairly",
    "while",
    "tokens",
    "flow",
    "through",
    "a",
    "shared",
    "gateway",
    "and",
    "every",
    "tenant",
    "waits",
    "its",
    "turn",
    "under",
    "aging",
    "rules",
    "batch",
    "jobs",
    "yield",
    "to",
    "chat",
    "so",
    "people",
    "get",
    "answers",
    "in",
    "time",
    "simulated",
    "gpu",
    "slots",
    "decode",
    "prefill",
    "window",
    "budget",
    "class",
    "priority",
)
FILLER_LENGTH_TOKENS = 8192


class SimError(Exception):
    """An error answered to the client as OpenAI-shaped JSON."""

    def __init__(self, status: int, code: str, message: str, err_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.err_type = err_type


def invalid(message: str, code: str = "invalid_request") -> SimError:
    return SimError(400, code, message, "invalid_request_error")


@dataclass(frozen=True)
class CompletionRequest:
    kind: str  # CHAT | TEXT | EMBED
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    inputs: tuple[str, ...] = ()  # EMBED: each input, as text (token ids as their decimal list)
    dimensions: int = EMBEDDING_DIMENSIONS
    base64: bool = False  # EMBED: encoding_format "base64" (float32, little-endian)
    choices: int = 1  # n per prompt
    tool: str | None = None  # CHAT: the function the answer calls (the first of ``tools``)


def error_body(code: str, message: str, err_type: str) -> bytes:
    payload = {"error": {"message": message, "type": err_type, "code": code, "param": None}}
    return json.dumps(payload).encode()


def parse_request(kind: str, raw_body: bytes) -> CompletionRequest:
    """Validate a chat or text completion body; raise SimError(400) on anything malformed."""
    try:
        body = json.loads(raw_body)
    except (ValueError, UnicodeDecodeError):
        raise invalid("The request body is not valid JSON.", "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required and must be a non-empty string.")
    if kind == EMBED:
        return _embeddings_request(body, model)
    if kind == CHAT:
        prompt_tokens = count_chat_tokens(body.get("messages")) + len(json.dumps(body.get("tools") or [])) // 4
        prompts = 1
    else:
        prompt_tokens = count_prompt_tokens(body.get("prompt"))
        prompts = _prompts(body["prompt"])
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object.")
    include_usage = bool(stream and options and options.get("include_usage") is True)
    max_tokens = _max_tokens(body, kind)
    choices = prompts * _positive(body, "n")
    tool = _tool_called(body) if kind == CHAT else None
    return CompletionRequest(kind, model, prompt_tokens, max_tokens, stream, include_usage, choices=choices, tool=tool)


def _prompts(prompt: list[Any] | str) -> int:
    """A string or one array of token ids is one prompt; an array of strings or of arrays, one each."""
    return len(prompt) if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else 1


def _positive(body: dict[str, Any], field: str) -> int:
    value = body.get(field, 1)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"'{field}' must be a positive integer.")
    return value


def _tool_called(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    function = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid("Each tool must be {type: function, function: {name, ...}}.")
    return name


def _embeddings_request(body: dict[str, Any], model: str) -> CompletionRequest:
    raw: Any = body.get("input")
    try:
        prompt_tokens = count_prompt_tokens(raw)  # refuses anything but a string or a non-empty array
    except SimError:
        raise invalid("'input' is required: a string, an array of strings, or token arrays.") from None
    if isinstance(raw, str):
        inputs: tuple[str, ...] = (raw,)
    elif all(isinstance(item, str) for item in raw):
        inputs = tuple(raw)
    elif all(isinstance(item, int) for item in raw):
        inputs = (json.dumps(raw),)
    else:
        inputs = tuple(json.dumps(item) for item in raw)
    dimensions = body.get("dimensions", EMBEDDING_DIMENSIONS)
    if (
        isinstance(dimensions, bool)
        or not isinstance(dimensions, int)
        or not 1 <= dimensions <= MAX_EMBEDDING_DIMENSIONS
    ):
        raise invalid(f"'dimensions' must be an integer from 1 to {MAX_EMBEDDING_DIMENSIONS}.")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid("'encoding_format' must be 'float' or 'base64'.")
    if body.get("stream"):
        raise invalid("Embeddings are not streamed.")
    return CompletionRequest(EMBED, model, prompt_tokens, None, False, False, inputs, dimensions, encoding == "base64")


def embedding_of(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text`` (the same text always gives the same vector)."""
    rng = random.Random(zlib.crc32(text.encode()))
    vector = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def embeddings_body(req: CompletionRequest, usage: dict[str, int]) -> bytes:
    data = []
    for index, text in enumerate(req.inputs):
        vector = embedding_of(text, req.dimensions)
        encoded: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if req.base64 else vector
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    usage = {"prompt_tokens": usage["prompt_tokens"], "total_tokens": usage["prompt_tokens"]}
    return json.dumps({"object": "list", "data": data, "model": req.model, "usage": usage}).encode()


def count_chat_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' is required and must be a non-empty array.")
    total = CHAT_OVERHEAD_TOKENS
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid("Each message must be an object with a string 'role'.")
        total += MESSAGE_OVERHEAD_TOKENS + _content_chars(message.get("content")) // 4
    return total


def _content_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    raise invalid("Message 'content' must be a string or an array of parts.")


def count_prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return 1 + len(prompt) // 4
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            return sum(1 + len(item) // 4 for item in prompt)
        if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
            return len(prompt)
        if all(isinstance(item, list) for item in prompt):
            return sum(len(item) for item in prompt)
    raise invalid("'prompt' is required: a string, an array of strings, or token arrays.")


def _optional_bool(body: dict[str, Any], field: str) -> bool:
    value = body.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{field}' must be a boolean.")
    return value


def _max_tokens(body: dict[str, Any], kind: str) -> int | None:
    value = body.get("max_tokens")
    if value is None and kind == CHAT:
        value = body.get("max_completion_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid("'max_tokens' must be a positive integer.")
    return value


class Filler:
    """Deterministic filler text: a seeded word sequence, entered at a per-request offset."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        words = [" " + rng.choice(FILLER_WORDS) for _ in range(FILLER_LENGTH_TOKENS)]
        self._words = words + words  # a slice from any offset never wraps

    def tokens(self, key: int, count: int) -> list[str]:
        count = min(count, FILLER_LENGTH_TOKENS)
        start = key % FILLER_LENGTH_TOKENS
        return self._words[start : start + count]


@dataclass(frozen=True)
class ResponseIdentity:
    """The id/created/model triple repeated in every body and chunk of one response."""

    response_id: str
    created: int
    model: str


DONE_EVENT = b"data: [DONE]\n\n"
