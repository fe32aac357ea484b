"""Operations endpoints: health, readiness, metrics, the OpenAPI document, error handlers."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import Resolver404
from django.views.defaults import page_not_found
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.db import db_call
from gateway.errors import ErrorCode, GatewayError, internal_error, invalid_request, not_found
from gateway.metrics import exposition
from gateway.openapi import openapi_document
from gateway.runtime import dispatcher_get
from gateway.views import api_view, json_response, logged

log = logging.getLogger(__name__)
BROWSER_PATHS = ("/admin/", "/console/")


@api_view("GET", "HEAD")
async def healthz(request: HttpRequest) -> HttpResponse:
    return json_response({"status": "ok"})


def _db_ping() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


@api_view("GET", "HEAD")
async def readyz(request: HttpRequest) -> HttpResponse:
    """200 when the database answers, a configuration is loaded and a backend is enabled; else 503
    (while the database is down, say). A check that raises is logged here as a WARNING, and the
    503 is not logged again by Django."""
    checks = {"database": False, "config": False, "backend": False}
    try:
        await db_call(_db_ping)()
        checks["database"] = True
        d = await dispatcher_get()
        checks["config"] = bool(d.config.classes)
        checks["backend"] = any(b.enabled for b in d.backend_specs.values())
    except Exception as exc:  # not ready is an answer, not an error
        log.warning("readiness check failed: %s: %s", type(exc).__name__, exc)
    if all(checks.values()):
        return json_response({"status": "ready", "checks": checks})
    return logged(json_response({"status": "not_ready", "checks": checks}, status=503))


@api_view("GET")
async def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)


@api_view("GET")
async def openapi_view(request: HttpRequest) -> HttpResponse:
    return json_response(openapi_document())


# Django's own errors, in the OpenAI shape (wired as handler400/404/500 in config/urls.py).


def handler400(request: HttpRequest, exception=None) -> HttpResponse:
    """Left for Django to log: a SuspiciousOperation (a bad Host, say) is a security event."""
    if isinstance(exception, RequestDataTooBig):
        return GatewayError(413, ErrorCode.REQUEST_TOO_LARGE, "The request body is too large.").to_response()
    return invalid_request("The request could not be read.").to_response()


def _plain(exception) -> Http404:
    """The 404 with its reason when a view gave one in words; none for an unknown path."""
    reason = "" if isinstance(exception, Resolver404) or exception is None or not exception.args else exception.args[0]
    return Http404(reason if isinstance(reason, str) else "")


def handler404(request: HttpRequest, exception=None) -> HttpResponse:
    """An unknown path: the client's mistake, logged at INFO (Django would log a WARNING)."""
    if request.path.startswith(BROWSER_PATHS):  # people in a browser get a page
        return page_not_found(request, _plain(exception))
    unknown = request.path[:200]
    log.info("%s %s: 404 unknown path", request.method, unknown)
    return logged(not_found(f"Unknown path {unknown}. See /v1/openapi.json for the endpoints.").to_response())


def handler500(request: HttpRequest) -> HttpResponse:
    """Left for Django to log, with the traceback."""
    return internal_error().to_response()
