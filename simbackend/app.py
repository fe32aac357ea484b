"""The simulated GPU backend as a raw ASGI application (no framework, so it stays cheap).

Endpoints: POST /v1/chat/completions, POST /v1/completions (streaming and not),
POST /v1/embeddings (deterministic vectors; prefill time only), GET /v1/models, GET /healthz,
GET /stats[?request_id=...], POST /stats/reset,
GET /gate and POST /gate {"action": "close"|"open"|"allow", "n": 1} (see gate.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs

from .answer import Choice, ChunkEncoder, completion_body
from .config import SimConfig
from .door import door_check, key_check
from .gate import Gate
from .model import Capacity, Rejection, ServicePlan, SimStats, plan_service
from .protocol import (
    CHAT,
    DONE_EVENT,
    EMBED,
    TEXT,
    CompletionRequest,
    Filler,
    ResponseIdentity,
    SimError,
    embeddings_body,
    error_body,
    parse_request,
)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_BODY_BYTES = 16 * 1024 * 1024
CHUNK_INTERVAL_MIN_S = 0.02  # at most ~50 stream events per second per request
CHOICE_KEY_STEP = 7919  # each choice enters the filler text elsewhere
JSON_HEADERS: Headers = [(b"content-type", b"application/json")]
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
COMPLETION_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": TEXT, "/v1/embeddings": EMBED}


class SimBackendApp:
    """One simulated GPU server: its capacity, counters and deterministic generators."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.capacity = Capacity(config)
        self.stats = SimStats()
        self.gate = Gate()  # open: nothing is held unless a test closes it
        self.filler = Filler(config.seed)
        self._fail_rng = random.Random(config.seed)
        self._lease_ids = itertools.count(1)
        self._tokens_per_event = max(1, math.ceil(config.tokens_per_s * CHUNK_INTERVAL_MIN_S))
        self._models_body = _models_body(config)
        self.unauthorized = 0  # calls refused for their key (--api-key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self._route(scope, receive, send)
            except SimError as err:
                await _send_error(send, err)
        elif scope["type"] == "lifespan":
            await _lifespan(receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        deployment, path = door_check(self.config, scope)
        kind = COMPLETION_PATHS.get(path)
        if kind is not None:
            _require_method(method, "POST")
            self._authorize(scope)
            await self._completion(kind, scope, receive, send, deployment=deployment)
        elif path == "/v1/models" and not self.config.azure:
            _require_method(method, "GET")
            self._authorize(scope)
            await _send_body(send, 200, self._models_body)
        elif path == "/healthz":
            await _send_body(send, 200, b'{"status":"ok"}')
        elif path == "/stats":
            _require_method(method, "GET")
            await _send_body(send, 200, self._stats_body(scope))
        elif path == "/stats/reset":
            _require_method(method, "POST")
            self.stats.reset()
            await _send_body(send, 200, b'{"status":"reset"}')
        elif path == "/gate":
            if method == "POST":
                self._control_gate(await _read_body(receive))
            else:
                _require_method(method, "GET")
            await _send_body(send, 200, json.dumps(self.gate.state()).encode())
        else:
            raise SimError(404, "not_found", f"No route for {method} {path}.", "invalid_request_error")

    def _authorize(self, scope: Scope) -> None:
        try:
            key_check(self.config, _header(scope, b"authorization"), _header(scope, b"api-key"))
        except SimError:
            self.unauthorized += 1
            raise

    def _stats_body(self, scope: Scope) -> bytes:
        snapshot = self.stats.snapshot(self.capacity, _now_ms()) | {"unauthorized": self.unauthorized}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "request_id" in query:
            snapshot["seen"] = self.stats.has_seen(query["request_id"][0])
        return json.dumps(snapshot).encode()

    async def _completion(self, kind: str, scope: Scope, receive: Receive, send: Send, *, deployment: str) -> None:
        self.stats.record_arrival(_header(scope, b"x-request-id"))
        raw_body = await _read_body(receive)
        try:
            req = self._parse(kind, raw_body, deployment)
        except SimError:
            self.stats.bad_requests += 1
            raise
        self._maybe_fail()
        config = self.config
        if req.kind == EMBED:  # no output: the prefill alone
            per_choice = 0
        else:
            per_choice = min(req.max_tokens or config.default_max_tokens, config.max_tokens_cap)
            per_choice += config.extra_completion_tokens
        prompt_tokens = math.ceil(req.prompt_tokens * config.prompt_token_factor)
        plan = plan_service(
            config, prompt_tokens=prompt_tokens, completion_tokens=per_choice * req.choices, choices=req.choices
        )
        lease_id = next(self._lease_ids)
        start_ms = _now_ms()
        rejection = self.capacity.try_admit(lease_id, plan, start_ms)
        if rejection is not None:
            self.stats.record_rejection(rejection)
            await _send_rate_limited(send, rejection)
            return
        self.stats.record_admitted(self.capacity.in_flight)
        try:
            held = not self.gate.try_pass()  # the slot stays taken while held, as on a stuck GPU
            if held and await _held_at(self.gate, receive):
                cancelled = True
            else:  # service time counts from when the gate let the request through
                job = _Job(self, req, plan, lease_id, zlib.crc32(raw_body), (_now_ms() if held else start_ms) / 1000.0)
                cancelled = await (job.stream(receive, send) if req.stream else job.respond(receive, send))
        finally:
            self.capacity.release(lease_id)
        self.stats.record_done(plan, cancelled=cancelled)

    def _control_gate(self, raw_body: bytes) -> None:
        try:
            body = json.loads(raw_body or b"{}")
            action, n = body.get("action"), body.get("n", 1)
        except (ValueError, AttributeError):
            action, n = None, None
        if action == "close":
            self.gate.close()
        elif action == "open":
            self.gate.open()
        elif action == "allow" and isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            self.gate.allow(n)
        else:
            raise SimError(
                400,
                "invalid_gate_action",
                'Send {"action": "close"|"open"|"allow", "n": <int >= 0>}.',
                "invalid_request_error",
            )

    def _parse(self, kind: str, raw_body: bytes, deployment: str = "") -> CompletionRequest:
        req = parse_request(kind, raw_body)
        if deployment:  # azure: the deployment is the model (the body's is ignored, as Azure does)
            req = replace(req, model=deployment)
        if self.config.models and req.model not in self.config.models:
            raise SimError(
                404,
                "model_not_found",
                f"The model '{req.model}' does not exist on this backend; it serves: {', '.join(self.config.models)}.",
                "invalid_request_error",
            )
        return req

    def _maybe_fail(self) -> None:
        if self.config.fail_rate > 0 and self._fail_rng.random() < self.config.fail_rate:
            self.stats.failed += 1
            raise SimError(500, "simulated_failure", "The simulated backend failed (--fail-rate).", "server_error")


class _Job:
    """One admitted request being served: waits out its plan, then answers (or streams)."""

    def __init__(
        self, app: SimBackendApp, req: CompletionRequest, plan: ServicePlan, lease_id: int, key: int, start_s: float
    ) -> None:
        self.req = req
        self.plan = plan
        self.start_s = start_s
        per_choice = plan.completion_tokens // req.choices
        self.tokens = [app.filler.tokens(key + index * CHOICE_KEY_STEP, per_choice) for index in range(req.choices)]
        self.reasoning_tokens = app.config.reasoning_tokens if req.kind == CHAT else 0
        self.tokens_per_event = app._tokens_per_event
        self.finish = "length" if req.max_tokens is not None else "stop"
        prefix = "chatcmpl-sim" if req.kind == CHAT else "cmpl-sim"
        self.ident = ResponseIdentity(f"{prefix}{lease_id}", int(time.time()), req.model)

    def usage(self) -> dict[str, int]:
        plan = self.plan
        return {
            "prompt_tokens": plan.prompt_tokens,
            "completion_tokens": plan.completion_tokens,
            "total_tokens": plan.total_tokens,
        }

    def headers(self, base: Headers) -> Headers:
        plan = self.plan
        return base + [
            (b"x-sim-service-ms", str(round(plan.total_ms)).encode()),
            (b"x-sim-ttft-ms", str(round(plan.prefill_ms)).encode()),
            (b"x-sim-prompt-tokens", str(plan.prompt_tokens).encode()),
            (b"x-sim-completion-tokens", str(plan.completion_tokens).encode()),
        ]

    def _choice(self, tokens: list[str], start: int, end: int) -> Choice:
        """The part of a choice from token ``start`` to ``end``: its first tokens are reasoning."""
        split = max(start, min(end, self.reasoning_tokens))
        return Choice("".join(tokens[start:split]), "".join(tokens[split:end]))

    async def respond(self, receive: Receive, send: Send) -> bool:
        """Non-streaming: hold the slot for the whole plan; True if the client left first."""
        if await _wait_until(receive, self.start_s + self.plan.total_ms / 1000.0):
            return True
        if self.req.kind == EMBED:
            body = embeddings_body(self.req, self.usage())
        else:
            choices = [self._choice(tokens, 0, len(tokens)) for tokens in self.tokens]
            body = completion_body(self.req, self.ident, choices, self.finish, self.usage())
        await _send_body(send, 200, body, self.headers(JSON_HEADERS))
        return False

    async def stream(self, receive: Receive, send: Send) -> bool:
        """SSE: first event at the prefill time, then text at the decode speed, batched."""
        await send({"type": "http.response.start", "status": 200, "headers": self.headers(SSE_HEADERS)})
        encoder = ChunkEncoder(self.req, self.ident)
        first_s = self.start_s + self.plan.prefill_ms / 1000.0
        if await _wait_until(receive, first_s):
            return True
        pending = [encoder.start(choice) for choice in range(len(self.tokens))]
        step, per_choice = self.tokens_per_event, len(self.tokens[0])
        seconds_per_token = self.plan.decode_ms / 1000.0 / max(1, per_choice)
        for index in range(0, per_choice, step):
            if await _flush_then_wait(receive, send, pending, first_s + index * seconds_per_token):
                return True
            for choice, tokens in enumerate(self.tokens):
                part = self._choice(tokens, index, index + step)
                pending += [encoder.reasoning(part.reasoning, choice), encoder.text(part.text, choice)]
        if await _flush_then_wait(receive, send, pending, self.start_s + self.plan.total_ms / 1000.0):
            return True
        pending += [encoder.finish(self.finish, choice) for choice in range(len(self.tokens))]
        if self.req.include_usage:
            pending.append(encoder.usage(self.usage()))
        pending.append(DONE_EVENT)
        await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})
        return False


async def _held_at(gate: Gate, receive: Receive) -> bool:
    """Wait at the closed gate while watching for the client leaving; True if it left first."""
    passage = asyncio.ensure_future(gate.passage())
    left = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait((passage, left), return_when=asyncio.FIRST_COMPLETED)
    finally:
        passage.cancel()
        left.cancel()
    return passage not in done  # let through: the job itself notices a client that left too


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _flush_then_wait(receive: Receive, send: Send, pending: list[bytes], due_s: float) -> bool:
    """Send what is pending only if there is a real wait ahead; True if the client left."""
    if due_s <= asyncio.get_running_loop().time() + 0.001:
        return False
    if pending:
        await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
        pending.clear()
    return await _wait_until(receive, due_s)


async def _wait_until(receive: Receive, due_s: float) -> bool:
    """Sleep until loop time ``due_s`` while watching for the client disconnecting."""
    if due_s <= asyncio.get_running_loop().time():
        return False
    try:
        async with asyncio.timeout_at(due_s):
            while True:
                if (await receive())["type"] == "http.disconnect":
                    return True
    except TimeoutError:
        return False


def _now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _require_method(method: str, expected: str) -> None:
    if method != expected:
        raise SimError(405, "method_not_allowed", f"Use {expected} on this path.", "invalid_request_error")


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise SimError(413, "request_too_large", "The request body exceeds 16 MiB.", "invalid_request_error")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_body(send: Send, status: int, body: bytes, headers: Headers = JSON_HEADERS) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, err: SimError, headers: Headers = JSON_HEADERS) -> None:
    await _send_body(send, err.status, error_body(err.code, err.message, err.err_type), headers)


async def _send_rate_limited(send: Send, rejection: Rejection) -> None:
    retry_after_s = max(1, math.ceil(rejection.retry_after_ms / 1000.0))
    headers = JSON_HEADERS + [
        (b"retry-after", str(retry_after_s).encode()),
        (b"retry-after-ms", str(math.ceil(rejection.retry_after_ms)).encode()),
        (b"x-sim-reject-reason", rejection.reason.encode()),
    ]
    err_type = "tokens" if rejection.reason == "tpm" else "requests"
    await _send_error(send, SimError(429, "rate_limit_exceeded", rejection.message, err_type), headers)


def _models_body(config: SimConfig) -> bytes:
    created = int(time.time())
    data = [{"id": m, "object": "model", "created": created, "owned_by": "fairgate-sim"} for m in config.served_models]
    return json.dumps({"object": "list", "data": data}).encode()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
