"""One admitted request from its grant to its last byte: wait, call upstream, relay, end.

Every way out ends the request exactly once (``Dispatcher.end`` is idempotent), and with it its
bill (gateway.admission.Bill: settled if served, else released, once). Ends triggered by
cancellation run synchronously in the engine, and the billing call hands its ask to the Booker at
once, so a client that disconnects can neither leak a backend slot nor a hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse

from gateway import charging, metrics
from gateway.access import Trail
from gateway.admission import Admitted
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle import Outcome, State
from gateway.payload import Payload, upstream_body
from gateway.proxy import (
    SseFilter,
    answer_text,
    relayed_headers,
    retry_after_ms,
    sse_error,
    upstream_open,
    usage_of,
)
from gateway.tokens import count_text
from gateway.upstream import UpstreamError as UpstreamFailure
from gateway.upstream import UpstreamResponse
from scheduling.upstreams import CredentialMissing

CREDENTIAL_REFUSED = (401, 403)  # an upstream's answer about the gateway's key, never passed on

log = logging.getLogger(__name__)
DONE_EVENT = b"data: [DONE]"
_background: set[asyncio.Task] = set()


def spawn(coro) -> asyncio.Task:
    """Run a cleanup coroutine to its end even if the request's task is cancelled."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background cleanup failed", exc_info=task.exception())


def upstream_error(message: str) -> GatewayError:
    return GatewayError(502, ErrorCode.UPSTREAM_ERROR, message)


class Exchange:
    def __init__(self, admitted: Admitted, payload: Payload, trail: Trail | None = None) -> None:
        self.d = admitted.d
        self.entry = admitted.entry
        self.bill = admitted.bill  # settles or releases the hold, once (gateway.admission)
        self.payload = payload
        self.headers = admitted.headers  # Fairgate's response headers (id, class, downgrade)
        self.orphaned = False
        self.trail = trail or Trail(started_s=0.0, traceparent="", written=True)  # log line, series: gateway.access

    # --- ending --------------------------------------------------------------------------

    def finish(self, outcome: str, *, usage: tuple[int, int] | None = None, partial: bool = False) -> None:
        """End the request once: engine state, metrics, and its bill (settled if served)."""
        entry = self.entry
        served = usage is not None and entry.state == State.RUNNING
        prompt_tokens, output_tokens = usage or (0, 0)
        if not self.d.end(entry, outcome, prompt_tokens=prompt_tokens, output_tokens=output_tokens, served=served):
            if not self.orphaned:
                self.orphaned = True
                spawn(self._serve_orphan())
            return
        if served and outcome == Outcome.COMPLETED:
            metrics.COMPLETED.labels(entry.cls).inc()
        self.bill.end(outcome, served=served, backend=entry.backend or "", usage=usage or (0, 0), partial=partial)
        self.trail.finished(
            cls=entry.cls,
            backend=entry.backend,
            outcome=outcome,
            waited_ms=entry.waited_ms,
            usage=usage if served else None,
            settlement=self.bill.settlement,
        )

    def response_headers(self) -> dict[str, str]:
        return {**self.headers, "X-Priority-Class": self.entry.cls, "X-Queue-Wait-Ms": str(self.entry.waited_ms)}

    # --- the request's way ---------------------------------------------------------------

    async def run(self) -> HttpResponse | StreamingHttpResponse:
        try:
            upstream = await self._obtain()
            if self.payload.stream and upstream.status_code == 200:
                return self._stream(upstream)
            return await self._plain(upstream)
        except asyncio.CancelledError:
            self.finish(Outcome.CANCELLED)
            raise
        except charging.EarlyHoldRefused:
            raise
        except GatewayError as err:
            self.finish(err.code)
            err.headers.update(self.response_headers())
            raise
        except BaseException:
            self.finish(ErrorCode.UPSTREAM_ERROR)
            raise

    async def _serve_orphan(self) -> None:
        """The old gateway's way (``fifo`` preset): a request whose client left is still served."""
        try:
            await self._plain(await self._obtain())
        except BaseException as failed:
            self.finish(ErrorCode.UPSTREAM_ERROR)
            if not isinstance(failed, (GatewayError, charging.EarlyHoldRefused)):  # those: nobody to tell
                raise

    async def _obtain(self) -> UpstreamResponse:
        """Wait for a grant and open the upstream; retries 429s and failures through the queue."""
        entry = self.entry
        body = upstream_body(self.payload)
        while True:
            grant = await self.d.wait_for_grant(entry)
            metrics.WAIT.labels(entry.cls, entry.tenant).observe(grant.waited_ms / 1000)
            spec = self.d.backend_specs.get(grant.backend)
            if spec is None:
                raise upstream_error(f"Backend '{grant.backend}' is no longer configured.")
            try:
                response = await upstream_open(
                    spec,
                    self.payload.upstream_path,
                    body,
                    request_id=entry.public_id,
                    traceparent=self.trail.traceparent or None,
                )
            except UpstreamFailure as failure:
                self._failed(spec.name, failure.kind, str(failure))
                continue
            except CredentialMissing as missing:
                self._credential_refused(spec.name, str(missing))
                continue
            if response.status_code in CREDENTIAL_REFUSED:
                await response.aclose()  # unread: its body may echo part of the key
                self._credential_refused(spec.name, f"answered {response.status_code}")
                continue
            if response.status_code == 429:
                await response.aclose()
                self._rate_limited(spec.name, retry_after_ms(response.headers))
                continue
            if response.status_code >= 500:
                await response.aclose()
                self._failed(spec.name, "status", f"{spec.name} answered {response.status_code}")
                continue
            self.d.upstream_result(spec.name, ok=True)
            if not self.bill.confirmed:
                await self._confirm(response)
            return response

    async def _confirm(self, upstream: UpstreamResponse) -> None:
        """An early hold is booked before any of the answer is read. Refused: the upstream is
        abandoned unread and the request ends uncharged (its bill ended with the refusal: nothing
        was held); a budget refusal raises EarlyHoldRefused (gateway.intake admits it again)."""
        try:
            await self.bill.confirm()
        except BaseException as failed:
            spawn(upstream.aclose())
            if not isinstance(failed, GatewayError):  # cancelled, the database out: the caller ends it
                raise
            self.finish(Outcome.EARLY_HOLD_REFUSED)
            if failed.code == ErrorCode.BUDGET_EXHAUSTED:
                raise charging.EarlyHoldRefused from None
            raise

    def _rate_limited(self, backend: str, wait_ms: int) -> None:
        metrics.UPSTREAM_ERRORS.labels(backend, "429").inc()
        self.entry.requeues += 1
        if self.entry.requeues > settings.FAIRGATE_UPSTREAM_MAX_REQUEUES:
            raise upstream_error(f"The backend kept answering 429 ({self.entry.requeues} times); try again later.")
        self.d.requeue(self.entry, retry_after_ms=wait_ms)

    def _credential_refused(self, backend: str, detail: str) -> None:
        """The backend refused the gateway's key (or this process lacks it): not the client's own
        401. Its circuit opens at once; the request tries another backend of its model, else 502."""
        metrics.UPSTREAM_ERRORS.labels(backend, "credential").inc()
        self.d.credential_refused(backend, detail)
        self.entry.failures += 1
        bound = settings.FAIRGATE_UPSTREAM_RETRIES + len(self.d.backend_specs)
        if self.entry.failures > bound or not self.d.serves_now(self.entry.model):
            raise upstream_error(
                f"Upstream credential problem: backend '{backend}' refused the gateway's credential and no "
                "other backend serves this model now; the gateway's operator must fix the backend's key."
            )
        self.d.requeue(self.entry, retry_after_ms=0)

    def _failed(self, backend: str, kind: str, detail: str) -> None:
        log.warning("upstream failure on %s (%s): %s", backend, kind, detail)
        metrics.UPSTREAM_ERRORS.labels(backend, kind).inc()
        self.d.upstream_result(backend, ok=False)
        self.entry.failures += 1
        if self.entry.failures > settings.FAIRGATE_UPSTREAM_RETRIES or not self.d.serves_now(self.entry.model):
            raise upstream_error(
                f"The backend failed ({kind}) after {self.entry.failures} attempt(s); try again later."
            )
        self.d.requeue(self.entry, retry_after_ms=0)

    async def _plain(self, upstream: UpstreamResponse) -> HttpResponse:
        try:
            content = await upstream.aread()
        except UpstreamFailure as exc:
            metrics.UPSTREAM_ERRORS.labels(self.entry.backend or "", exc.kind).inc()
            self.d.upstream_result(self.entry.backend or "", ok=False)
            raise upstream_error(f"The backend broke off its answer ({exc}).") from None
        finally:
            await upstream.aclose()
        self.trail.first_token()
        if upstream.status_code < 300:
            usage = usage_of(content) or (self.payload.prompt_tokens, count_text(answer_text(content)))
            self.finish(Outcome.COMPLETED, usage=usage)
        else:
            self.finish(Outcome.UPSTREAM_REJECTED)
        response = HttpResponse(
            content, status=upstream.status_code, content_type=upstream.headers.get("content-type", "application/json")
        )
        response["Content-Length"] = str(len(content))
        if self.bill.settlement is not None:  # a client leaving now stops only this wait, not the booking
            charged = await self.bill.settled()
            if charged is not None:
                response["X-Charge"] = str(charged.amount)
                response["X-Charge-Currency"] = settings.FAIRGATE_CURRENCY
        return _with_headers(response, relayed_headers(upstream.headers), self.response_headers())

    def _stream(self, upstream: UpstreamResponse) -> StreamingHttpResponse:
        body = StreamBody(self, upstream)
        response = RelayResponse(
            body, status=200, content_type=upstream.headers.get("content-type", "text/event-stream")
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return _with_headers(response, relayed_headers(upstream.headers), self.response_headers())


def _with_headers(response, upstream: list[tuple[str, str]], ours: dict[str, str]):
    for name, value in upstream:
        if name.lower() != "content-type":
            response[name] = value
    for name, value in ours.items():
        response[name] = value
    return response


class StreamBody:
    """The relayed SSE body: an async iterator that ends its exchange however it stops."""

    def __init__(self, exchange: Exchange, upstream: UpstreamResponse) -> None:
        self.exchange = exchange
        self.upstream = upstream
        self.filter = SseFilter(forward_usage=exchange.payload.include_usage)
        self._chunks: AsyncIterator[bytes] | None = None
        self._done = False
        self._done_event = b""  # the stream's end, held back until its charge is booked
        self._loop = asyncio.get_running_loop()

    def __aiter__(self) -> StreamBody:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        if self._chunks is None:
            self._chunks = self.upstream.aiter_raw()
        try:
            while True:
                out = self._hold_back_done(self.filter.feed(await self._chunks.__anext__()))
                if out:
                    self.exchange.trail.first_token()
                    return out
        except StopAsyncIteration:
            tail = self._done_event + self.filter.flush()
            self.end(Outcome.COMPLETED)
            if self.exchange.bill.settlement is not None:  # booked, or journaled to be: then the end
                await self.exchange.bill.settled()
            if tail:
                return tail
            raise
        except UpstreamFailure as exc:
            backend = self.exchange.entry.backend or ""
            metrics.UPSTREAM_ERRORS.labels(backend, exc.kind).inc()
            self.exchange.d.upstream_result(backend, ok=False)
            self.end(ErrorCode.UPSTREAM_ERROR)
            return sse_error(f"The backend broke off the stream ({exc}).")
        except BaseException:
            self.end(Outcome.CANCELLED)
            raise

    def _hold_back_done(self, out: bytes) -> bytes:
        """Keeps ``data: [DONE]`` (and what follows) until the charge is booked: a client that has
        the end of its stream was served, so its charge must not be lost if the process dies."""
        at = out.find(DONE_EVENT)
        if at < 0:
            return out
        self._done_event += out[at:]
        return out[:at]

    def end(self, outcome: str) -> None:
        """Idempotent; sync (safe from a cancelled task): the slot is freed at once."""
        if self._done:
            return
        self._done = True
        exchange = self.exchange
        usage = self.filter.usage
        partial = outcome != Outcome.COMPLETED or usage is None
        if usage is None:  # abandoned or cut: charge what was relayed so far
            usage = (exchange.payload.prompt_tokens, count_text(self.filter.text_sent()))
        exchange.finish(outcome, usage=usage, partial=partial)
        exchange.trail.close()
        spawn(self.upstream.aclose())

    def __del__(self) -> None:
        if not self._done and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.end, Outcome.CANCELLED)


class RelayResponse(StreamingHttpResponse):
    """Ends the exchange when Django stops consuming (client gone), not only at the body's end."""

    def __init__(self, body: StreamBody, **kwargs) -> None:
        super().__init__(body, **kwargs)
        self._body = body

    async def __aiter__(self):
        try:
            async for part in self._body:
                yield part
        finally:
            self._body.end(Outcome.CANCELLED)
