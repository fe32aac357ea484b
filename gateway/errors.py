"""The one exception type a client ever sees, and its mapping to OpenAI-shaped JSON.

`{"error": {"message": ..., "type": ..., "code": ...}}` with the status of the table in the
README. 504 queue_timeout and 402 budget_exhausted carry `x-should-retry: false` (retrying a
queue timeout only adds load); 429 queue_full carries `Retry-After` in whole seconds.
"""
from __future__ import annotations

import json
import math

from django.http import HttpResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
_NO_RETRY = {"queue_timeout", "budget_exhausted"}


class GatewayError(Exception):
    def __init__(self, status: int, code: str, message: str, *, retry_after_ms: int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "api_error"), "code": self.code,
                          "param": None}}

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.code in _NO_RETRY:
            headers["x-should-retry"] = "false"
        if self.retry_after_ms is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_ms / 1000)))
            headers["retry-after-ms"] = str(max(0, int(self.retry_after_ms)))
        return headers

    def to_response(self) -> HttpResponse:
        response = HttpResponse(json.dumps(self.body()), status=self.status, content_type="application/json")
        response["Content-Length"] = str(len(response.content))
        for name, value in self.response_headers().items():
            response[name] = value
        return response


def invalid_request(message: str) -> GatewayError:
    return GatewayError(400, "invalid_request", message)


def not_found(message: str = "Not found.") -> GatewayError:
    return GatewayError(404, "not_found", message)
