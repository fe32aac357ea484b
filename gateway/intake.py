"""From an HTTP request to its answer: the class from its headers and a turn in its intake lane
(`intake_gate`, before the body is read), then auth → parse → estimate → classify (`intake`),
then hold → admit (gateway.admission) and run (gateway.exchange)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from gateway import access, admission, charging
from gateway.auth import Caller, authenticate
from gateway.clientip import client_ip
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.exchange import Exchange
from gateway.lanes import UNIDENTIFIED, UNIDENTIFIED_LEVEL, Turn, lanes
from gateway.lifecycle import PublicId, engine_id, ordered_id
from gateway.limits import output_limit, prompt_bound
from gateway.payload import EMBED, Payload, payload_estimate, payload_parse
from gateway.port import SchedulerPort
from gateway.runtime import dispatcher_get
from scheduling.engine.model import RequestId
from scheduling.engine.rules import Facts

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:@+=~-]{1,128}")
MAX_TIMEOUT_MS = 24 * 3_600_000
REQUEST_ID_ATTR = "fairgate_request_id"  # the HttpRequest attribute `intake` names the request's id in
INTAKE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})  # served by `serve`
GATE_SCOPE_KEY = "fairgate.gated"  # the ASGI scope's key for what `intake_gate` found
log = logging.getLogger(__name__)


def request_body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise GatewayError(
            413, ErrorCode.REQUEST_TOO_LARGE, f"The request body exceeds {settings.FAIRGATE_MAX_BODY_BYTES} bytes."
        ) from None


def new_request_id() -> PublicId:
    """``req_`` + 32 hex digits: the time in ms, then 80 random bits (time order: the ledger's index)."""
    return PublicId(ordered_id("req_", 10))


def _public_id(request: HttpRequest) -> PublicId:
    given = request.headers.get("X-Request-Id")
    if given is None:
        return new_request_id()
    if not REQUEST_ID_RE.fullmatch(given):
        raise invalid_request("X-Request-Id must be 1-128 characters of letters, digits and . _ : @ + = ~ -.")
    return PublicId(given)


def _job(request: HttpRequest) -> str | None:
    """The client's ``X-Job-Id``: its requests are one job on the console (as an X-Request-Id)."""
    given = request.headers.get("X-Job-Id")
    if given is not None and not REQUEST_ID_RE.fullmatch(given):
        raise invalid_request("X-Job-Id must be 1-128 characters of letters, digits and . _ : @ + = ~ -.")
    return given


def _timeout_ms(request: HttpRequest) -> int | None:
    raw = request.headers.get("X-Request-Timeout-Ms")
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TIMEOUT_MS:
        raise invalid_request(f"X-Request-Timeout-Ms must be an integer from 1 to {MAX_TIMEOUT_MS}.")
    return value


def _declared(request: HttpRequest, caller: Caller, d: SchedulerPort) -> str:
    declared = (request.headers.get("X-Priority-Class") or caller.default_class).strip()
    if declared not in d.rules.levels:
        known = ", ".join(c.name for c in sorted(d.config.classes, key=lambda c: c.level))
        raise invalid_request(f"Unknown priority class '{declared[:64]}'. Classes: {known}.")
    return declared


def classify(
    d: SchedulerPort, caller: Caller, declared: str, payload: Payload, src_ip: str | None
) -> tuple[str, str | None]:
    facts = Facts(
        declared_class=declared,
        prompt_tokens=payload.prompt_tokens,
        max_tokens=payload.max_tokens,
        tenant=caller.tenant,
        src_ip=src_ip,
    )
    return d.rules.classify(declared=declared, facts=facts, allowed=caller.allowed_classes)


@dataclass
class Gated:
    """A request that passed `intake_gate`, before its body was read: its turn in its lane (None in
    the top class)."""

    turn: Turn | None


def _free_headers(scope: dict) -> tuple[str | None, str | None]:
    """``Authorization`` and ``X-Priority-Class`` from the ASGI scope (latin-1, as Django reads them)."""
    authorization = declared = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"x-priority-class":
            declared = value.decode("latin-1")
    return authorization, declared


async def _identify(authorization: str | None) -> Caller | None:
    """The caller, None while its key cannot be looked up (an outage: its intake answers it, in the
    lane after every class); a key that does not authenticate raises its 401 here, before the body
    is read."""
    try:
        return await authenticate(authorization)
    except GatewayError:
        raise
    except Exception as exc:
        log.debug("intake gate: caller not identified (%s)", type(exc).__name__)
        return None


async def intake_gate(scope: dict) -> Gated | None:
    """For a request to one of ``INTAKE_PATHS``, before its body is read: its class from what costs
    nothing to read (the key, through the auth cache; ``X-Priority-Class``) and, below the top
    class, a turn in that class's intake lane (gateway.lanes), waited for here. None for other
    requests (and when there is no dispatcher to tell the classes: `intake` answers that). Raises
    GatewayError 401 invalid_api_key for a key that does not authenticate, 429 queue_full when the
    lane's backlog is full. The turn is the
    one `intake` runs its costly steps in; the caller of this releases it however the request ends
    (`Turn.release` once more does nothing)."""
    if scope.get("method") != "POST" or scope.get("path") not in INTAKE_PATHS:
        return None
    authorization, header_class = _free_headers(scope)
    caller = await _identify(authorization)
    try:
        d = await dispatcher_get()
    except Exception:  # not started: `intake` meets the same failure and answers it
        return None
    declared = (header_class or (caller.default_class if caller else "")).strip()
    level = d.rules.levels.get(declared) if caller is not None else None
    if level is None:
        level, declared = UNIDENTIFIED_LEVEL, UNIDENTIFIED
    if level <= d.rules.top_level:
        return Gated(None)
    return Gated(await lanes().take(level=level, cls=declared))


@asynccontextmanager
async def _intake_turn(gated: Gated | None, *, level: int, top_level: int, cls: str) -> AsyncIterator[bool]:
    """The turn of a request's costly intake steps: the one its gate took (given back at the end),
    else (a request that did not pass `intake_gate`: in-process tests) one taken here. Yields
    whether it runs in a lane."""
    if gated is None:
        async with lanes().lane(level=level, top_level=top_level, cls=cls) as in_lane:
            yield in_lane
        return
    try:
        yield gated.turn is not None
    finally:
        if gated.turn is not None:
            gated.turn.release()


@dataclass
class Asked:
    """A request authenticated, parsed, estimated and classified: what admitting it needs (once
    more, if its early hold is refused)."""

    d: SchedulerPort
    caller: Caller
    public_id: PublicId
    payload: Payload
    declared: str
    cls: str
    rule: str | None
    timeout_ms: int | None
    downgrade_recorded: bool = False
    job: str | None = None  # X-Job-Id
    batch_id: str | None = None  # a batch line's batch: its ledger entries' job
    priced_at: datetime | None = None  # the time whose prices apply (a batch line: its batch's creation); None: now
    hold_cap: Decimal | None = None  # the most it is held (a batch line: its part of its batch's cost bound)

    @property
    def engine_id(self) -> RequestId:
        return engine_id(self.caller.tenant, self.public_id)


async def intake(request: HttpRequest, kind: str) -> Asked:
    """Everything before the hold; raises GatewayError for a refused request. The request's id is
    named first (``request.fairgate_request_id``): gateway.views answers every refusal with it.
    What costs nothing to read (the key, the declared class) comes first; the costly steps run in
    the declared class's intake lane (gateway.lanes), in the turn `intake_gate` took if it did.
    The id is claimed (`SchedulerPort.claim`) before the first await that follows its check: `serve`
    gives it back once the request is admitted or refused."""
    gated: Gated | None = getattr(request, "scope", {}).get(GATE_SCOPE_KEY)
    public_id = _public_id(request)
    setattr(request, REQUEST_ID_ATTR, public_id)  # our own attribute: HttpRequest's type has none for it
    caller = await authenticate(request.headers.get("Authorization"))  # again: the key cache's answer of now
    d = await dispatcher_get()
    declared = _declared(request, caller, d)
    timeout_ms = _timeout_ms(request)
    job = _job(request)
    level = d.rules.levels[declared]
    async with _intake_turn(gated, level=level, top_level=d.rules.top_level, cls=declared) as in_lane:
        payload = payload_parse(kind, request_body(request))
        d.check_model(payload.model, embeddings=kind == EMBED)
        payload.output_limit = output_limit(payload)
        asked = Asked(d, caller, public_id, payload, declared, declared, None, timeout_ms, job=job)
        d.claim(asked.engine_id, tenant=caller.tenant, public_id=public_id)  # no await since the check
        try:
            await payload_estimate(payload, in_lane=in_lane)
            payload.prompt_bound = prompt_bound(payload)
            src_ip = client_ip(request.META.get("REMOTE_ADDR"), request.headers.get("X-Forwarded-For"))
            asked.cls, asked.rule = classify(d, caller, declared, payload, src_ip)
        except BaseException:
            d.unclaim(asked.engine_id)
            raise
    return asked


async def serve(request: HttpRequest, kind: str) -> HttpResponse | StreamingHttpResponse:
    """A request from intake to its answer, on its trail (gateway.access: its log line and series)."""
    trail = access.trail_start(request)
    try:
        response = await _served(request, kind, trail)
    except BaseException as failed:
        access.trail_failed(trail, failed)
        raise
    access.trail_answered(trail, response)
    return response


async def _served(request: HttpRequest, kind: str, trail: access.Trail) -> HttpResponse | StreamingHttpResponse:
    """An early hold refused for the budget (nothing was served or charged) is admitted again, hold
    first: a 402, or a cheaper class for a tenant set to fall back (gateway.admission)."""
    asked = await intake(request, kind)  # its id claimed until admitted or refused
    trail.asked(request_id=asked.public_id, tenant=asked.caller.tenant, cls=asked.cls, model=asked.payload.model)
    try:
        return await Exchange(await admission.admit(asked, early=True), asked.payload, trail).run()
    except charging.EarlyHoldRefused:
        return await Exchange(await admission.admit(asked, early=False), asked.payload, trail).run()
    finally:
        asked.d.unclaim(asked.engine_id)
