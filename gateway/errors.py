"""The one exception type a client ever sees, and its mapping to OpenAI-shaped JSON.

`{"error": {"message": ..., "type": ..., "code": ...}}` with the status of README.md's
table of errors; the retry headers each error carries are set here. `GatewayError.log_level`: INFO
for what a client or the queue policy caused, WARNING for a fault of the gateway or what it
depends on, ERROR for an unexpected exception.
"""

from __future__ import annotations

import json
import logging
import math
from enum import StrEnum

from django.http import HttpResponse


class ErrorCode(StrEnum):
    """Every ``code`` a client can get, with its status (`STATUS`): the README's error table in code."""

    INVALID_REQUEST = "invalid_request"  # 400: malformed JSON, bad fields, unknown model or class, limits
    INVALID_API_KEY = "invalid_api_key"  # 401: missing, unknown or revoked key
    BUDGET_EXHAUSTED = "budget_exhausted"  # 402: the budget cannot hold the request
    NOT_FOUND = "not_found"  # 404: unknown path, or another tenant's queue entry
    METHOD_NOT_ALLOWED = "method_not_allowed"  # 405
    REQUEST_TIMEOUT = "request_timeout"  # 408: headers or body too slow
    REQUEST_TOO_LARGE = "request_too_large"  # 413
    QUEUE_FULL = "queue_full"  # 429: the class is at its depth limit
    INTERNAL_ERROR = "internal_error"  # 500: a bug, logged
    UPSTREAM_ERROR = "upstream_error"  # 502: the backend failed after retries
    NO_BACKEND = "no_backend"  # 503: no enabled backend serves the model
    SERVICE_UNAVAILABLE = "service_unavailable"  # 503: the database is out of reach
    QUEUE_TIMEOUT = "queue_timeout"  # 504: waited past its deadline


STATUS = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_API_KEY: 401,
    ErrorCode.BUDGET_EXHAUSTED: 402,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.UPSTREAM_ERROR: 502,
    ErrorCode.NO_BACKEND: 503,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.QUEUE_TIMEOUT: 504,
}
# A database outage is usually over within seconds (a failover, a restart): retry soon.
SERVICE_UNAVAILABLE_RETRY_MS = 2_000

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
_NO_RETRY = {ErrorCode.QUEUE_TIMEOUT, ErrorCode.BUDGET_EXHAUSTED}
_LOG_LEVELS: dict[str, int] = {  # looked up by a code as given (an ErrorCode or its text)
    ErrorCode.INTERNAL_ERROR: logging.ERROR,
    ErrorCode.SERVICE_UNAVAILABLE: logging.WARNING,
    ErrorCode.UPSTREAM_ERROR: logging.WARNING,
}


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retry_after_ms: int | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.headers = dict(headers or {})

    @property
    def log_level(self) -> int:
        """INFO for an expected outcome; WARNING for a fault; ERROR for an unexpected failure."""
        return _LOG_LEVELS.get(self.code, logging.INFO)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "api_error"),
                "code": self.code,
                "param": None,
            }
        }

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
    return GatewayError(400, ErrorCode.INVALID_REQUEST, message)


def not_found(message: str = "Not found.") -> GatewayError:
    return GatewayError(404, ErrorCode.NOT_FOUND, message)


def internal_error() -> GatewayError:
    """An unexpected exception, answered without its details (they are logged)."""
    return GatewayError(500, ErrorCode.INTERNAL_ERROR, "The gateway failed unexpectedly; it has been logged.")


def service_unavailable() -> GatewayError:
    """The gateway cannot reach its database: nothing was admitted or charged, a retry is safe."""
    return GatewayError(
        503,
        ErrorCode.SERVICE_UNAVAILABLE,
        "The gateway cannot reach its database right now; the request was not run. Retry after the Retry-After delay.",
        retry_after_ms=SERVICE_UNAVAILABLE_RETRY_MS,
    )
