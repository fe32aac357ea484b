"""The OpenAI-compatible endpoints and queue visibility: thin async views.

Every view is key-authenticated (no sessions, no CSRF) and answers errors in the OpenAI shape
through `GatewayError`, mapped in `api_view`: a database that cannot be reached becomes 503
service_unavailable with Retry-After, any other unexpected exception a plain 500 without a trace.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from gateway import metrics
from gateway.auth import authenticate
from gateway.db import DATABASE_UNAVAILABLE
from gateway.errors import ErrorCode, GatewayError, internal_error, not_found, service_unavailable
from gateway.intake import REQUEST_ID_ATTR, REQUEST_ID_RE, serve
from gateway.lifecycle import State
from gateway.payload import CHAT, EMBED, TEXT
from gateway.runtime import dispatcher_get

log = logging.getLogger(__name__)
View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]  # a stream is a StreamingHttpResponse


def json_response(data, status: int = 200) -> HttpResponse:
    response = HttpResponse(json.dumps(data), status=status, content_type="application/json")
    response["Content-Length"] = str(len(response.content))
    return response


def logged(response: HttpResponse) -> HttpResponse:
    """``response``, marked as logged already: Django's handler would log it again, every 4xx as a
    WARNING and every 5xx as an ERROR (``django.utils.log.log_response`` skips a marked one)."""
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's private flag: not in django-stubs
    return response


def _request_id(request: HttpRequest) -> str | None:
    """The id a refusal names: the one intake gave the request, else the client's own if it is
    valid (a request refused before intake: 405, an outage)."""
    named = getattr(request, REQUEST_ID_ATTR, None)
    if named is not None:
        return named
    given = request.headers.get("X-Request-Id")
    return given if given is not None and REQUEST_ID_RE.fullmatch(given) else None


def error_response(request: HttpRequest, err: GatewayError, cause: BaseException | None = None) -> HttpResponse:
    """``err`` as the response, counted and logged once at its level (expected outcomes at INFO);
    ``cause`` is the exception it stands for, with its traceback from ERROR on."""
    return refusal(request.method or "", request.path, _request_id(request), err, cause)


def refusal(
    method: str, path: str, named: str | None, err: GatewayError, cause: BaseException | None = None
) -> HttpResponse:
    """`error_response` for a request named ``named`` (if any), also before a Django request exists
    (gateway.asgi's intake gate)."""
    metrics.REJECTS.labels(err.code).inc()
    if named is not None:
        err.headers.setdefault("X-Request-Id", named)
    detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    log.log(
        err.log_level,
        "%s %s: %s %s%s",
        method,
        path,
        err.status,
        err.code,
        detail,
        exc_info=cause if err.log_level >= logging.ERROR else None,
    )
    return logged(err.to_response())


def api_view(*methods: str) -> Callable[[View], View]:
    """Method check, then the one mapping of failures to responses: GatewayError → its response,
    a database outage → 503 service_unavailable, anything else → a 500 without details."""

    def wrap(view: View) -> View:
        @csrf_exempt
        @functools.wraps(view)
        async def handler(request: HttpRequest, *args, **kwargs) -> HttpResponseBase:
            try:
                if request.method not in methods:
                    raise GatewayError(
                        405,
                        ErrorCode.METHOD_NOT_ALLOWED,
                        f"Use {' or '.join(methods)} on {request.path}.",
                        headers={"Allow": ", ".join(methods)},
                    )
                return await view(request, *args, **kwargs)
            except GatewayError as err:
                return error_response(request, err)
            except DATABASE_UNAVAILABLE as exc:
                return error_response(request, service_unavailable(), exc)
            except Exception as exc:
                return error_response(request, internal_error(), exc)

        return handler

    return wrap


@api_view("POST")
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    return await serve(request, CHAT)


@api_view("POST")
async def completions(request: HttpRequest) -> HttpResponseBase:
    return await serve(request, TEXT)


@api_view("POST")
async def embeddings(request: HttpRequest) -> HttpResponseBase:
    return await serve(request, EMBED)


@api_view("GET")
async def models(request: HttpRequest) -> HttpResponse:
    await authenticate(request.headers.get("Authorization"))
    d = await dispatcher_get()
    served = sorted({m for b in d.backend_specs.values() if b.enabled for m in b.models})
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "fairgate"} for m in served]
    return json_response({"object": "list", "data": data})


@api_view("GET")
async def queue_list(request: HttpRequest) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    d = await dispatcher_get()
    await d.fresh()
    now_ms = d.now_ms()
    items = [d.live_view(e, now_ms) for e in d.entries_of(caller.tenant)]
    items.sort(key=lambda i: (i["state"] != State.RUNNING, i["position"] or 0))
    return json_response({"object": "list", "data": items})


@api_view("GET")
async def queue_detail(request: HttpRequest, request_id: str) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    d = await dispatcher_get()
    await d.fresh()
    now_ms = d.now_ms()
    entry = d.entry_of(caller.tenant, request_id)
    if entry is not None:
        return json_response(d.live_view(entry, now_ms))
    record = d.terminal.get(caller.tenant, request_id, now_ms=now_ms)
    if record is None:
        raise not_found(f"No request '{request_id[:128]}' of yours is queued, running or finished in the last hour.")
    return json_response(record)
