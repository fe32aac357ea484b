"""The gateway's OpenAPI 3 document (GET /v1/openapi.json), written by hand.

It describes what Fairgate checks, not the whole OpenAI schema: other fields pass through.
"""

from __future__ import annotations

from functools import lru_cache

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": "string"},
                "param": {"type": ["string", "null"]},
            },
        }
    },
}
_ERRORS = {
    "400": "invalid_request: malformed JSON, missing or wrong fields, unknown model or class, a model sent to the "
    "wrong endpoint (embedding models only to /v1/embeddings), an output limit or n above the maximum, an "
    "X-Request-Id already served",
    "401": "invalid_api_key: missing, unknown or revoked key",
    "402": "budget_exhausted: the tenant's budget cannot cover the request (x-should-retry: false)",
    "404": "not_found",
    "408": "request_timeout: the request's headers or body did not arrive in time",
    "413": "request_too_large",
    "429": "queue_full: the class's queue is at its depth limit; retry after Retry-After seconds",
    "502": "upstream_error: the backend failed after retries",
    "503": "no_backend: no enabled backend serves the model; service_unavailable: the database is out of reach "
    "(retry after Retry-After seconds)",
    "504": "queue_timeout: not dispatched before the deadline (x-should-retry: false); degrade, do not retry",
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]},
        "name": {"type": "string"},
    },
}
_COMMON = {
    "model": {"type": "string", "minLength": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "n": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number"},
}
_HEADERS_IN = [
    {
        "name": "X-Priority-Class",
        "in": "header",
        "schema": {"type": "string"},
        "description": "Declared class (default: the key's class); may be lowered by downgrade rules.",
    },
    {
        "name": "X-Request-Id",
        "in": "header",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@+=~-]{1,128}$"},
        "description": "Your own id, unique among your live requests.",
    },
    {
        "name": "X-Request-Timeout-Ms",
        "in": "header",
        "schema": {"type": "integer", "minimum": 1},
        "description": "How long you are willing to wait in the queue.",
    },
]
_HEADERS_OUT = {
    name: {"schema": {"type": "string"}, "description": text}
    for name, text in (
        ("X-Request-Id", "The request's id (yours or generated)."),
        ("X-Priority-Class", "The effective class."),
        ("X-Priority-Downgraded", "'<declared>; rule=<rule name>' when the class was lowered."),
        ("X-Queue-Wait-Ms", "Time spent waiting for a backend."),
    )
}
_QUEUE_ITEM = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "class": {"type": "string"},
        "declared_class": {"type": "string"},
        "downgrade_rule": {"type": ["string", "null"]},
        "state": {"type": "string"},
        "position": {"type": ["integer", "null"]},
        "eta_ms": {"type": ["integer", "null"], "description": "Expected wait before it starts (ms)."},
        "eta_upper_ms": {
            "type": ["integer", "null"],
            "description": "It should start within this many ms: at least eta_ms, at most twice it.",
        },
        "eta_confidence": {
            "type": ["string", "null"],
            "enum": ["measured", "prior", "blocked", None],
            "description": "measured; prior: no request of its class has completed yet; "
            "blocked: a higher class holds the pool.",
        },
        "eta_slip_reason": {
            "type": ["string", "null"],
            "enum": ["higher_class", "fair_share", "circuit_open", None],
            "description": "Set once its expected start is past the first one given: why.",
        },
        "eta_first_at_ms": {
            "type": ["integer", "null"],
            "description": "The expected start first given for it (epoch ms).",
        },
        "waited_ms": {"type": "integer"},
        "model": {"type": "string"},
    },
}


def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(ok: dict) -> dict:
    out = {"200": ok}
    for status, text in _ERRORS.items():
        out[status] = {"description": text, **_json({"$ref": "#/components/schemas/Error"})}
    return out


def _completion(path_summary: str, required: list[str], extra: dict) -> dict:
    body = {"type": "object", "required": required, "properties": {**_COMMON, **extra}, "additionalProperties": True}
    ok = {
        "description": "The backend's answer, unchanged (JSON, or SSE when stream is true).",
        "headers": _HEADERS_OUT,
        **_json({"type": "object"}),
    }
    ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": path_summary,
            "security": [{"bearer": []}],
            "parameters": _HEADERS_IN,
            "requestBody": {"required": True, **_json(body)},
            "responses": _responses(ok),
        }
    }


def _embeddings(item: dict) -> dict:
    body = {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                    {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                    {"type": "array", "minItems": 1, "items": {"type": "array", "items": {"type": "integer"}}},
                ]
            },
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1},
        },
        "additionalProperties": True,
    }
    ok = {
        "description": "The backend's answer, unchanged (a list of embeddings).",
        "headers": _HEADERS_OUT,
        **_json(item),
    }
    return {
        "post": {
            "summary": "Embeddings of a model a backend declares in embedding_models; held and charged for the input",
            "security": [{"bearer": []}],
            "parameters": _HEADERS_IN,
            "requestBody": {"required": True, **_json(body)},
            "responses": _responses(ok),
        }
    }


def _get(summary: str, schema: dict, *, auth: bool = True, parameters: list | None = None) -> dict:
    op = {"summary": summary, "responses": _responses({"description": "OK", **_json(schema)})}
    if auth:
        op["security"] = [{"bearer": []}]
    if parameters:
        op["parameters"] = parameters
    return {"get": op}


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    prompt = {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "integer"}},
        ]
    }
    listing = {"type": "object", "properties": {"object": {"type": "string"}, "data": {"type": "array"}}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Fairgate gateway",
            "version": "1",
            "description": "OpenAI-compatible ingress with priority classes, fair queues and downgrade rules.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR, "QueueItem": _QUEUE_ITEM},
        },
        "paths": {
            "/v1/chat/completions": _completion(
                "Chat completion",
                ["model", "messages"],
                {
                    "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
                    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
                },
            ),
            "/v1/completions": _completion("Text completion", ["model", "prompt"], {"prompt": prompt}),
            "/v1/embeddings": _embeddings(listing),
            "/v1/files": {
                **_get("Your files (cursor: after, limit, order, purpose)", listing),
                "post": {
                    "summary": "Upload a batch input file (multipart: file, purpose=batch)",
                    "security": [{"bearer": []}],
                    "responses": _responses({"description": "The file object", **_json({"type": "object"})}),
                },
            },
            "/v1/files/{file_id}": _get(
                "One of your files (DELETE removes it)",
                {"type": "object"},
                parameters=[{"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            ),
            "/v1/batches": {
                **_get("Your batches, newest first (cursor: after, limit)", listing),
                "post": {
                    "summary": "Create a batch from an uploaded file (input_file_id, endpoint, completion_window 24h)",
                    "security": [{"bearer": []}],
                    "responses": _responses({"description": "The batch object", **_json({"type": "object"})}),
                },
            },
            "/v1/batches/{batch_id}": _get(
                "One of your batches, with request_counts",
                {"type": "object"},
                parameters=[{"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            ),
            "/v1/batches/{batch_id}/cancel": {
                "post": {
                    "summary": "Stop granting its lines; the running ones finish",
                    "security": [{"bearer": []}],
                    "responses": _responses({"description": "The batch object", **_json({"type": "object"})}),
                }
            },
            "/v1/files/{file_id}/content": _get(
                "The file's bytes",
                {"type": "string"},
                parameters=[{"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            ),
            "/v1/models": _get("Models served by enabled backends", listing),
            "/v1/queue": _get("Your waiting and running requests", listing),
            "/v1/queue/{request_id}": _get(
                "One request, live or finished in the last hour",
                {"$ref": "#/components/schemas/QueueItem"},
                parameters=[{"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            ),
            "/healthz": _get("Process up", {"type": "object"}, auth=False),
            "/readyz": _get("Database, configuration and a backend ready", {"type": "object"}, auth=False),
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
        },
    }
