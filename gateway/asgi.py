"""ASGI pieces around Django for the gateway: a lean handler for the API paths, a path router,
and the lifespan wrapper that starts and stops the embedded dispatcher.

The API paths skip the settings' middleware stack (sessions, CSRF, auth, messages, clickjacking
serve browser users; each of their hooks would cost a thread hop through `sync_to_async`).
The view chain is then fully async, so Django cancels a view whose client disconnects.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponse, HttpResponseBase
from django.urls import get_resolver, resolve
from django.urls.resolvers import ResolverMatch, URLResolver

from gateway import access, charging, live
from gateway.auth import authenticate
from gateway.connlimit import CLIENT, connection_limit
from gateway.db import DATABASE_UNAVAILABLE
from gateway.errors import ErrorCode, GatewayError
from gateway.intake import GATE_SCOPE_KEY, INTAKE_PATHS, REQUEST_ID_RE, intake_gate, new_request_id
from gateway.lanes import Turn
from gateway.runtime import dispatcher_get, dispatcher_stop
from gateway.tarpit import tarpit
from gateway.views import refusal

log = logging.getLogger(__name__)
API_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics")
UPLOAD_PATH = "/v1/files"  # the Batch API's uploads (batches.views): bodies of their own size and time
UPLOAD_FORM_BYTES = 64 * 1024  # what a multipart form adds around the file
PUBLIC_PATHS = frozenset({"/v1/openapi.json"})  # the API paths served without a key
BODY_IN_TURN_MS = 250  # a body still on its way this long into its intake turn is read out of turn
# The collector's thresholds once serving: (50,000, 10, 10) against Python's (700, 10, 10). The request
# path leaves no cyclic garbage (tests/live/gateway/test_no_cyclic_garbage.py), so a young collection
# finds nothing to free and only walks the objects of the requests in flight (its cost measured:
# bench/REPORT-gateway.md, "Notes moved from code").
GC_THRESHOLDS = (50_000, 10, 10)


class GatewayASGIHandler(ASGIHandler):
    """Django's ASGI handler without middleware (URL routing, views and error handlers stay).

    Its request cycle is leaner than Django's, built from the same parts (read_body,
    create_request, run_get_response, send_response, listen_for_disconnect):

    * no per-request ``ThreadSensitiveContext`` (Django's starts a thread per request for
      sync work); ``sync_to_async`` calls share asgiref's one thread-sensitive worker;
    * no ``request_started``/``request_finished`` signals: their receivers are synchronous
      (two thread hops per request, a quarter of the gateway's CPU per request) and only
      recycle database connections, which ``gateway.db.db_call`` does before each ORM call;
    * as in Django, a client that disconnects cancels the view's task;
    * a request to the intake paths first waits for its turn in its class's intake lane
      (gateway.intake.intake_gate: from the key and ``X-Priority-Class`` alone), before its body is
      read or a Django request is made: a batch flood waits as headers, not as work; past the
      lane's backlog it is refused 429 there. A body that is not all in within BODY_IN_TURN_MS of
      its turn gives the turn back (a slow client does not hold a lane) and waits for one again
      once it is all there;
    * a body that is not all there within FAIRGATE_BODY_TIMEOUT_MS is answered 408 (slow clients);
      a file upload's (``UPLOAD_PATH``) within FAIRGATE_UPLOAD_TIMEOUT_MS;
    * before any body is read: one declared larger than its path's limit (FAIRGATE_MAX_BODY_BYTES, a
      file upload's FAIRGATE_FILE_MAX_BYTES) is refused 413, and a request with a body whose key
      does not authenticate 401 (from the headers); while it streams in, a body of any framing
      (chunked, or an understated Content-Length) is cut off with 413 at its limit. A refusal of
      an unread body closes the connection; a 401 past the free rate waits in the tarpit first
      (gateway.tarpit), and limits its address's connections for a while (gateway.connlimit); a
      valid key lifts that limit.
    """

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"the gateway handler serves HTTP only, not {scope['type']!r}")
        upload = scope["path"] == UPLOAD_PATH
        limit_bytes = _body_limit(scope)
        peer = (scope.get("client") or (None,))[0]
        CLIENT.set(peer)  # a valid key (gateway.auth) lifts its address's connection limit
        try:
            if _declared_length(scope) > limit_bytes:
                raise _too_large(scope)
            await _key_checked(scope)
            gated = await intake_gate(scope)  # an intake path's key is checked there
        except GatewayError as err:  # 413 as declared, 401 from the headers, or its lane's backlog full
            if err.status == 401:
                connection_limit().refused(peer)
                await tarpit().hold()
            await self.send_response(_refused_at_gate(scope, err), send)
            return
        receive = _bounded(receive, limit_bytes)
        if gated is None:
            await self._handle(scope, receive, send, upload=upload)
            return
        scope[GATE_SCOPE_KEY] = gated  # for gateway.intake, which gives the turn back once it is done with it
        try:
            await self._handle(scope, receive, send, upload=False, turn=gated.turn)
        finally:
            if gated.turn is not None:
                gated.turn.release()  # if the request ended before its intake did

    async def _handle(self, scope, receive, send, *, upload: bool, turn: Turn | None = None) -> None:
        limit_ms = settings.FAIRGATE_UPLOAD_TIMEOUT_MS if upload else settings.FAIRGATE_BODY_TIMEOUT_MS
        try:
            async with asyncio.timeout(limit_ms / 1000):  # for the whole body
                body_file = await (self.read_body(receive) if turn is None else self._read_in_turn(receive, turn))
        except RequestAborted:
            return
        except _BodyTooLarge:
            await self.send_response(_refused_at_gate(scope, _too_large(scope)), send)
            return
        except TimeoutError:
            await self.send_response(_body_late(limit_ms), send)
            return
        try:
            if turn is not None and not turn.held:
                try:
                    await turn.again()  # the body took its time: its costly steps wait in the lane again
                except GatewayError as err:
                    await self.send_response(_refused_at_gate(scope, err), send)
                    return
            request, error_response = self.create_request(scope, body_file)
            if request is None:  # then Django made the response refusing it
                await self.send_response(cast(HttpResponseBase, error_response), send)
                return
            await self._respond(request, receive, send)
        finally:
            body_file.close()

    async def _read_in_turn(self, receive, turn: Turn):
        """The body, read in ``turn``; one not all in within BODY_IN_TURN_MS gives the turn back
        (its client is slow: the next request in the lanes goes on meanwhile) and is read on. (A
        timer, not a task around the read: no extra task for every request below the top class.)"""
        late = asyncio.get_running_loop().call_later(BODY_IN_TURN_MS / 1000, turn.release)
        try:
            return await self.read_body(receive)
        finally:
            late.cancel()

    async def _respond(self, request, receive, send) -> None:
        """The view, run in this task, beside a listener for the client's disconnect: a disconnect
        cancels the view, the view's end cancels the listener. Neither raises on the normal path: an
        exception kept by a task ties the task, its traceback and their frames into a cycle that only
        the garbage collector frees, and at a thousand requests a second its full collections cost
        50-100 ms pauses."""
        watch = _Watch(asyncio.current_task())
        listener = asyncio.create_task(_disconnected(receive))
        listener.add_done_callback(watch.left)
        try:
            await self._view(request, send)
        except asyncio.CancelledError:
            if not watch.cancelled or watch.task.uncancel() > 0:  # not the client's leaving: passed on
                raise
            failure = listener.exception()
            if failure is not None:
                raise failure from None
        finally:
            watch.over = True
            if not listener.done():
                listener.cancel()
                await asyncio.wait((listener,))

    async def _view(self, request, send) -> None:
        response = await self.run_get_response(request)
        try:
            await self.send_response(response, send)
        except asyncio.CancelledError:  # the client left while we were sending
            pass

    def resolve_request(self, request) -> ResolverMatch:
        """Django's URL resolution, but an intake path's match is resolved once per URLconf and reused."""
        path = request.path_info
        if path not in INTAKE_PATHS or hasattr(request, "urlconf"):
            return super().resolve_request(request)
        resolver = get_resolver()
        match = _INTAKE_MATCHES.get((resolver, path))
        if match is None:
            match = _INTAKE_MATCHES[(resolver, path)] = resolver.resolve(path)
        request.resolver_match = match
        return match

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Callable[..., Any]] = []
        self._template_response_middleware: list[Callable[..., Any]] = []
        self._exception_middleware: list[Callable[..., Any]] = []
        get_response = (
            self._get_response_async  # type: ignore[attr-defined]  # Django's private method: not in django-stubs
            if is_async
            else self._get_response  # type: ignore[attr-defined]  # as above
        )
        self._middleware_chain = convert_exception_to_response(get_response)


_INTAKE_MATCHES: dict[tuple[URLResolver, str], ResolverMatch] = {}  # (URLconf's resolver, path) -> its match


class _Watch:
    """Whether a request's view is still running (its task's), for the listener of its disconnect."""

    __slots__ = ("cancelled", "over", "task")

    def __init__(self, task) -> None:
        self.task = task
        self.over = False
        self.cancelled = False

    def left(self, listener: asyncio.Task) -> None:
        if not self.over and not listener.cancelled():
            self.cancelled = True
            self.task.cancel()


def _body_late(limit_ms: int) -> HttpResponse:
    """408 for a body that did not arrive within its time. The connection is closed after it: the
    rest of the body may still be on its way, and would otherwise keep it open."""
    message = f"The request body did not arrive within {limit_ms} ms."
    return GatewayError(408, ErrorCode.REQUEST_TIMEOUT, message, headers={"Connection": "close"}).to_response()


def _refused_at_gate(scope, err: GatewayError) -> HttpResponse:
    """``err`` (its body too large, its key refused, a lane's backlog full), answered before the
    request reached Django. It names the
    client's ``X-Request-Id`` if valid, a new id if it sent none (as `gateway.intake` would have
    named it), none for an invalid one."""
    if _body_announced(scope):  # and not read: the connection ends with the answer
        err.headers.setdefault("Connection", "close")
    named: str | None = new_request_id()
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given = value.decode("latin-1")
            named = given if REQUEST_ID_RE.fullmatch(given) else None
    if scope["path"] in INTAKE_PATHS:  # its access-log line
        access.gate_refused(scope, request_id=named, err=err)
    return refusal(scope["method"], scope["path"], named, err)


def _declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _body_announced(scope) -> bool:
    return any(
        (name == b"content-length" and value.strip() not in (b"", b"0")) or name == b"transfer-encoding"
        for name, value in scope.get("headers", ())
    )


def _body_limit(scope) -> int:
    """The most a request's body may hold: a file upload's, else a JSON request's."""
    if scope["path"] == UPLOAD_PATH:
        return settings.FAIRGATE_FILE_MAX_BYTES + UPLOAD_FORM_BYTES
    return settings.FAIRGATE_MAX_BODY_BYTES


def _too_large(scope) -> GatewayError:
    if scope["path"] == UPLOAD_PATH:
        message = f"A file is at most {settings.FAIRGATE_FILE_MAX_BYTES} bytes here (FAIRGATE_FILE_MAX_BYTES)."
    else:
        message = f"The request body exceeds {settings.FAIRGATE_MAX_BODY_BYTES} bytes (FAIRGATE_MAX_BODY_BYTES)."
    return GatewayError(413, ErrorCode.REQUEST_TOO_LARGE, message, headers={"Connection": "close"})


class _BodyTooLarge(Exception):
    """A body that grew past its limit while it streamed in (`_bounded`)."""


def _bounded(receive, limit_bytes: int):
    """``receive`` that raises _BodyTooLarge once the body's bytes pass ``limit_bytes``, whatever
    its framing (a Content-Length that understates it, or chunks)."""
    received = 0

    async def bounded():
        nonlocal received
        message = await receive()
        received += len(message.get("body", b""))
        if received > limit_bytes:
            raise _BodyTooLarge
        return message

    return bounded


async def _key_checked(scope) -> None:
    """Raises 401 for a request with a body whose key does not authenticate, from its headers and
    before the body is read. The intake paths' POSTs are checked by `intake_gate`; a public path
    and a request without a body are left to their view; so is a key that cannot be looked up
    now (a database outage: the view answers 503)."""
    path = scope["path"]
    if not path.startswith("/v1/") or path in PUBLIC_PATHS or not _body_announced(scope):
        return
    if scope["method"] == "POST" and path in INTAKE_PATHS:
        return
    authorization = next((v.decode("latin-1") for n, v in scope.get("headers", ()) if n == b"authorization"), None)
    try:
        await authenticate(authorization)
    except DATABASE_UNAVAILABLE:
        return


async def _disconnected(receive) -> None:
    """Returns when the client has disconnected (Django's listener raises instead)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ApiRouter:
    """HTTP on the API paths → ``api``; everything else (admin, console, static) → ``site``."""

    def __init__(self, api, site) -> None:
        self.api = api
        self.site = site

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(API_PREFIXES):
            await self.api(scope, receive, send)
        else:
            await self.site(scope, receive, send)


class Lifespan:
    """Answers the ASGI lifespan scope (Django and Channels do not) around ``app``."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await dispatcher_get()
                    await charging.start()  # the billing worker process
                    resolve("/v1/models")  # import the URLconf and views now, not on the first request
                    live.serving()  # the console's live pushes and the batch feeder start, beside the dispatcher
                    # Everything loaded so far (Django, the app, the tokenizer) lives as long as the
                    # process: move it out of the collector's way, so full collections stay short.
                    gc.collect()
                    gc.freeze()
                    gc.set_threshold(*GC_THRESHOLDS)
                except Exception as exc:
                    log.exception("the dispatcher did not start")
                    await send({"type": "lifespan.startup.failed", "message": f"dispatcher: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await live.stopping()
                    await dispatcher_stop()
                    await charging.stop()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})
                return
