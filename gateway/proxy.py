"""Talking to backends: pooled HTTP clients, upstream calls, header and SSE handling.

One keep-alive pool (``gateway.upstream``) per backend URL and event loop. Responses are
opened as soon as status and headers are in, so a 429 or 5xx can still be retried before any
byte reaches the client, and a 200 is relayed as it arrives.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import time

from django.conf import settings

from gateway.errors import ErrorCode
from gateway.upstream import Headers, Pool, UpstreamResponse
from scheduling.engine.model import BackendSpec
from scheduling.upstreams import upstream_headers, upstream_path

# Headers of a backend's answer that its client may see (see relayed_headers).
RELAYED = frozenset({"content-type", "openai-processing-ms", "openai-version"})
DEFAULT_RETRY_AFTER_MS = 1000

_pools: dict[tuple[str, int], Pool] = {}


def _pool(spec: BackendSpec) -> Pool:
    key = (spec.url, id(asyncio.get_running_loop()))
    pool = _pools.get(key)
    if pool is None or pool.closed:
        pool = _pools[key] = Pool(
            spec.url,
            connect_timeout_s=settings.FAIRGATE_UPSTREAM_CONNECT_TIMEOUT_MS / 1000,
            read_timeout_s=settings.FAIRGATE_UPSTREAM_READ_TIMEOUT_MS / 1000,
            max_idle=spec.slots + 8,
        )
    return pool


async def clients_close() -> None:
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _pools if k[1] == loop_id]:
        _pools.pop(key).close()


async def upstream_open(
    spec: BackendSpec, path: str, body: bytes, *, request_id: str, traceparent: str | None = None
) -> UpstreamResponse:
    """POST ``body`` to the backend; returns the open response (read or close it)."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "X-Request-Id": request_id}
    if traceparent is not None:  # W3C trace context (gateway.access)
        headers["traceparent"] = traceparent
    headers.update(upstream_headers(spec))  # its key and extra headers (scheduling.upstreams)
    return await _pool(spec).post(upstream_path(spec, path, body), body, headers)


def retry_after_ms(headers: Headers) -> int:
    """The upstream's retry-after (``retry-after-ms``, seconds or an HTTP date) in ms."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0, int(float(raw_ms)))
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw:
        try:
            return max(0, int(float(raw) * 1000))
        except ValueError:
            parsed = email.utils.parsedate_tz(raw)
            if parsed is not None:
                return max(0, int((email.utils.mktime_tz(parsed) - time.time()) * 1000))
    return DEFAULT_RETRY_AFTER_MS


def relayed_headers(headers: Headers) -> list[tuple[str, str]]:
    """The backend's headers that are passed on to the client: an allow-list (``RELAYED``).

    Passed on: ``content-type``, and what OpenAI's API sends about the answer itself
    (``openai-processing-ms``, ``openai-version``), which OpenAI clients may log or show.

    Not passed on, as everything else:

    * hop-by-hop and framing headers (``connection``, ``transfer-encoding``, ``content-length``...):
      they describe the gateway's connection to the backend; Django frames the client's answer;
    * the backend's private details: ``x-sim-*`` of the simulator, ``server``, ``set-cookie``, and
      ``openai-organization``/``openai-project`` (the gateway's upstream account);
    * ``x-ratelimit-*``: the upstream account's limits and what every tenant together has left,
      not the client's own (its limits are Fairgate's queues, whose 429s carry Retry-After);
    * ``retry-after``/``retry-after-ms``/``x-should-retry``: the gateway absorbs the backend's
      429s and 5xx by queueing the request again, so whether and when to retry is Fairgate's to
      say (its own errors carry these headers);
    * ``x-request-id``: the client's request id is Fairgate's (set with its other headers).
    """
    return [(k, v) for k, v in headers.multi_items() if k.lower() in RELAYED]


def usage_of(content: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a JSON completion body, if it has them."""
    try:
        usage = json.loads(content).get("usage")
        return int(usage["prompt_tokens"]), int(usage.get("completion_tokens") or 0)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


_EVENT_END = re.compile(rb"\r?\n\r?\n")


class SseFilter:
    """Relays SSE bytes event by event; takes the usage chunk out when the client did not ask.

    The gateway always asks the backend for ``stream_options.include_usage``; the final chunk
    with ``usage`` and no choices is recorded here and forwarded only if the client asked.
    """

    def __init__(self, *, forward_usage: bool) -> None:
        self.forward_usage = forward_usage
        self.usage: tuple[int, int] | None = None
        self._buffer = b""
        self.sent: list[bytes] = []

    def feed(self, chunk: bytes) -> bytes:
        data = self._buffer + chunk
        out: list[bytes] = []
        start = 0
        for match in _EVENT_END.finditer(data):
            event = data[start : match.end()]
            start = match.end()
            if self._keep(event):
                out.append(event)
        self._buffer = data[start:]
        joined = b"".join(out)
        if joined:
            self.sent.append(joined)
        return joined

    def flush(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        if rest and self._keep(rest):
            self.sent.append(rest)
            return rest
        return b""

    def _keep(self, event: bytes) -> bool:
        if b'"usage"' not in event:
            return True
        payload = _data_of(event)
        if not isinstance(payload, dict) or not isinstance(payload.get("usage"), dict):
            return True
        usage = payload["usage"]
        try:
            self.usage = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        except (TypeError, ValueError):
            return True
        return self.forward_usage or bool(payload.get("choices"))

    def text_sent(self) -> str:
        """Everything generated that was relayed so far, of every choice (to charge an abandoned
        stream): text, reasoning, and the function names and argument deltas of tool calls."""
        parts: list[str] = []
        for event in _EVENT_END.split(b"".join(self.sent)):
            payload = _data_of(event)
            choices = payload.get("choices") if isinstance(payload, dict) else None
            parts += _choices_texts(choices)
        return "".join(parts)


def answer_text(content: bytes) -> str:
    """Everything generated in a whole (not streamed) answer, of every choice: to charge one that
    came without ``usage`` for what it holds."""
    try:
        choices = json.loads(content).get("choices")
    except (ValueError, AttributeError):
        return ""
    return "".join(_choices_texts(choices))


def _choices_texts(choices) -> list[str]:
    """The generated texts of a chunk's or an answer's choices (a delta, a message, or text)."""
    texts: list[str] = []
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict):
            said = choice.get("delta", choice.get("message"))
            texts += _delta_texts(said) if isinstance(said, dict) else _strings(choice, ("text",))
    return texts


DELTA_TEXT_KEYS = ("content", "reasoning_content", "reasoning", "refusal")
CALL_TEXT_KEYS = ("name", "arguments")


def _strings(holder: dict, keys: tuple[str, ...]) -> list[str]:
    return [holder[key] for key in keys if isinstance(holder.get(key), str)]


def _delta_texts(delta: dict) -> list[str]:
    """The generated text of a chat chunk's delta: content, reasoning, tool and function calls."""
    texts = _strings(delta, DELTA_TEXT_KEYS)
    calls = delta.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            texts += _strings(function, CALL_TEXT_KEYS)
    if isinstance(delta.get("function_call"), dict):
        texts += _strings(delta["function_call"], CALL_TEXT_KEYS)
    return texts


def _data_of(event: bytes):
    lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    if not lines or lines[0] == b"[DONE]":
        return None
    try:
        return json.loads(b"\n".join(lines))
    except ValueError:
        return None


def sse_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": ErrorCode.UPSTREAM_ERROR, "code": ErrorCode.UPSTREAM_ERROR}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
