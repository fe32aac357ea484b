"""The one exception type a client ever sees, and its mapping to OpenAI-shaped JSON.

`{"error": {"message": ..., "type": ..., "code": ...}}` with the status of the table in the
README. 504 queue_timeout and 402 budget_exhausted carry `x-should-retry: false` (retrying a
queue timeout only adds load); 429 queue_full and 503 service_unavailable carry `Retry-After` in
whole seconds (and `retry-after-ms`).

Each error also says how loudly it is logged (`GatewayError.log_level`): what a client or the
queue policy caused (4xx, queue_timeout, no_backend) is an expected outcome, logged at INFO; a
fault of the gateway or what it depends on (upstream, database) at WARNING; an unexpected
exception at ERROR.
"""

from __future__ import annotations

import json
import logging
import math

from django.http import HttpResponse

INTERNAL_ERROR = "internal_error"
SERVICE_UNAVAILABLE = "service_unavailable"
UPSTREAM_ERROR = "upstream_error"
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
_NO_RETRY = {"queue_timeout", "budget_exhausted"}
_LOG_LEVELS = {INTERNAL_ERROR: logging.ERROR, SERVICE_UNAVAILABLE: logging.WARNING, UPSTREAM_ERROR: logging.WARNING}


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
    return GatewayError(400, "invalid_request", message)


def not_found(message: str = "Not found.") -> GatewayError:
    return GatewayError(404, "not_found", message)


def internal_error() -> GatewayError:
    """An unexpected exception, answered without its details (they are logged)."""
    return GatewayError(500, INTERNAL_ERROR, "The gateway failed unexpectedly; it has been logged.")


def service_unavailable() -> GatewayError:
    """The gateway cannot reach its database: nothing was admitted or charged, a retry is safe."""
    return GatewayError(
        503,
        SERVICE_UNAVAILABLE,
        "The gateway cannot reach its database right now; the request was not run. Retry after the Retry-After delay.",
        retry_after_ms=SERVICE_UNAVAILABLE_RETRY_MS,
    )
