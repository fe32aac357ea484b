"""Each API request's trail: its series by tenant and class (gateway.metrics) and one JSON line on
the ``fairgate.access`` logger (``FAIRGATE_ACCESS_LOG``), written once, when the answer has ended
and its charge is known. Also the request's W3C trace context, sent upstream (``traceparent``).

Labels come from configuration only: the tenant of an authenticated key and a class the rules
named; a request refused before both are known is logged, and counted only by gateway.metrics.REJECTS.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase, StreamingHttpResponse

from gateway import metrics
from gateway.db import DATABASE_UNAVAILABLE
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle import Outcome

ACCESS_LOG = logging.getLogger("fairgate.access")
TRAIL_ATTR = "fairgate_trail"  # the HttpRequest attribute the request's Trail is kept in
CLIENT_CLOSED = 499  # the client left before its answer began (nginx's code)
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16


def traceparent_of(given: str | None) -> str:
    """The client's ``traceparent`` if it is a valid version-00 one (passed on as it came: the
    gateway records no spans of its own), else a new trace's (sampled)."""
    if given is not None:
        match = _TRACEPARENT.fullmatch(given.strip())
        if match is not None and match[1] != _NO_TRACE and match[2] != _NO_SPAN:
            return given.strip()
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


@dataclass(slots=True, eq=False)
class Trail:
    """What one request's log line and series say, filled in as it goes."""

    started_s: float
    traceparent: str
    request_id: str | None = None
    tenant: str | None = None
    cls: str | None = None
    model: str | None = None
    backend: str | None = None
    status: int | None = None
    outcome: str | None = None
    queue_wait_ms: int | None = None
    first_token_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    settlement: asyncio.Future | None = None  # the Charged of a served request (gateway.admission.Bill)
    ended_s: float | None = None
    written: bool = False

    def asked(self, *, request_id: str, tenant: str, cls: str, model: str) -> None:
        self.request_id, self.tenant, self.cls, self.model = request_id, tenant, cls, model

    def first_token(self) -> None:
        """The answer's first bytes are going to the client (a whole answer's: all of it)."""
        if self.first_token_s is None:
            self.first_token_s = time.monotonic()

    def finished(
        self, *, cls: str, backend: str | None, outcome: str, waited_ms: int, usage: tuple[int, int] | None, settlement
    ) -> None:
        """The request's end in the engine (gateway.exchange.Exchange.finish)."""
        self.cls, self.backend, self.outcome, self.queue_wait_ms = cls, backend, outcome, waited_ms
        self.prompt_tokens, self.completion_tokens = usage or (0, 0)
        self.settlement = settlement

    def close(self, status: int | None = None, outcome: str | None = None) -> None:
        """The answer has ended: written in the loop's next turn, or once its settlement is booked."""
        if self.ended_s is not None:
            return
        self.ended_s = time.monotonic()
        self.status = status if status is not None else self.status
        self.outcome = self.outcome or outcome
        if self.settlement is not None and not self.settlement.done():
            self.settlement.add_done_callback(lambda _: self._write())
        else:
            _after_answer(self._write)

    def _charge(self) -> Decimal | None:
        done = self.settlement
        if done is None or done.cancelled() or done.exception() is not None:
            return None
        charged = done.result()
        return None if charged is None else charged.amount

    def _write(self) -> None:
        if self.written:
            return
        self.written = True
        charge = self._charge()
        if self.tenant is not None and self.cls is not None:
            self._count(charge)
        if settings.FAIRGATE_ACCESS_LOG:
            ACCESS_LOG.info(json.dumps(self._line(charge), separators=(",", ":")))

    def _count(self, charge: Decimal | None) -> None:
        labels = (self.tenant, self.cls)
        metrics.REQUESTS.labels(*labels, self.outcome or "").inc()
        if self.prompt_tokens:
            metrics.TOKENS.labels(*labels, "prompt").inc(self.prompt_tokens)
        if self.completion_tokens:
            metrics.TOKENS.labels(*labels, "completion").inc(self.completion_tokens)
        if charge:
            metrics.SPEND.labels(*labels).inc(float(charge))  # Decimal everywhere else
        if self.first_token_s is not None:
            metrics.FIRST_TOKEN.labels(*labels).observe(self.first_token_s - self.started_s)

    def _line(self, charge: Decimal | None) -> dict:
        def ms(at_s: float | None) -> int | None:
            return None if at_s is None else round((at_s - self.started_s) * 1000)

        return {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "request_id": self.request_id,
            "tenant": self.tenant,
            "class": self.cls,
            "model": self.model,
            "backend": self.backend,
            "status": self.status,
            "outcome": self.outcome,
            "queue_wait_ms": self.queue_wait_ms,
            "ttft_ms": ms(self.first_token_s),
            "total_ms": ms(self.ended_s),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "charge": None if charge is None else str(charge),
            "currency": settings.FAIRGATE_CURRENCY,
            "trace_id": self.traceparent[3:35],
            "pid": os.getpid(),
        }


def _after_answer(write: Callable[[], None]) -> None:
    """``write`` in the event loop's next turn, once the answer in hand has gone out (at once when
    no loop runs)."""
    try:
        asyncio.get_running_loop().call_soon(write)
    except RuntimeError:
        write()


def trail_start(request: HttpRequest) -> Trail:
    trail = Trail(started_s=time.monotonic(), traceparent=traceparent_of(request.headers.get("traceparent")))
    setattr(request, TRAIL_ATTR, trail)
    return trail


def trail_answered(trail: Trail, response: HttpResponseBase) -> None:
    """A relayed stream's trail is closed by its end (gateway.exchange.StreamBody)."""
    if isinstance(response, StreamingHttpResponse):
        trail.status = response.status_code
    else:
        trail.close(response.status_code)


def trail_failed(trail: Trail, failed: BaseException) -> None:
    """The request raised instead of answering: closed with what gateway.views will answer."""
    if isinstance(failed, GatewayError):
        trail.close(failed.status, failed.code)
    elif isinstance(failed, asyncio.CancelledError):
        trail.close(CLIENT_CLOSED, Outcome.CANCELLED)
    elif isinstance(failed, DATABASE_UNAVAILABLE):
        trail.close(503, ErrorCode.SERVICE_UNAVAILABLE)
    elif isinstance(failed, Exception):
        trail.close(500, ErrorCode.INTERNAL_ERROR)


def gate_refused(scope: dict, *, request_id: str | None, err: GatewayError) -> None:
    """A request refused before it reached Django (gateway.asgi: its key, its lane's backlog, its size)."""
    given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"traceparent"), None)
    Trail(started_s=time.monotonic(), traceparent=traceparent_of(given), request_id=request_id).close(
        err.status, err.code
    )
