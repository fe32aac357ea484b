"""The Celery side of batches: a worker runs a line the engine granted (batches.feeder sent it).

`run_line` starts the send it was given of a line (batches.leases: once per send, only the line's
latest), keeps the line's lease while it calls the backend the line was granted, then, in one
transaction, books the line's charge (its hold, made by the gateway that fed it, settled at the
class's price; at most the hold) and writes its result — or, if the backend failed, releases the
hold and writes the failure. The result is written only while the line is still ``sent``: a line
run again because its first worker looked dead (its lease lapsed) is written and charged by
whichever run ends first, once; so a line appears once in the output and once in the ledger.
"""

from __future__ import annotations

import logging
import os
import threading

import httpx
from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from batches import files, service
from batches.client_json import NUL, REPLACEMENT, JsonRefused, json_storable
from batches.finalize import batch_finalize, batches_finalize
from batches.leases import line_start, renewer
from batches.lines import line_payload
from batches.models import BatchLine
from billing.client import charge_settle, hold_release
from gateway.api import PublicId, engine_id, estimate, upstream_body
from scheduling.models import Backend
from scheduling.selectors import backend_spec_of
from scheduling.upstreams import CredentialMissing, upstream_headers, upstream_path

log = logging.getLogger(__name__)
State = BatchLine.State
CLIENT_KEEPALIVE = 64  # idle connections kept to the backends (a worker runs up to its threads' lines at once)


class _Upstream:
    """One HTTP client per worker process for every line it runs (its pool of connections to the
    backends reused, not a client built and torn down per line); a forked pool child makes its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._pid = 0

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                timeout = httpx.Timeout(
                    settings.FAIRGATE_UPSTREAM_READ_TIMEOUT_MS / 1000,
                    connect=settings.FAIRGATE_UPSTREAM_CONNECT_TIMEOUT_MS / 1000,
                )
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=CLIENT_KEEPALIVE)
                self._client, self._pid = httpx.Client(timeout=timeout, limits=limits), os.getpid()
            return self._client


upstream = _Upstream()


def _ledger_key(line: BatchLine) -> str:
    """Its hold's key (the attempt's, if the line was fed again after its first gateway died)."""
    return line.ledger_key or engine_id(line.batch.tenant.slug, PublicId(service.public_id_of(line)))


def _finish(line: BatchLine, *, status: int, body: object, usage: dict | None) -> None:
    """Books the line's charge (or releases its hold) and writes its end, once."""
    with transaction.atomic():
        locked = BatchLine.objects.select_for_update().filter(pk=line.pk, state=State.SENT).first()
        if locked is None:  # ended by an earlier run of this task
            return
        locked.status_code, locked.response, locked.ended_at = status, body, timezone.now()
        if usage is not None:
            locked.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            locked.completion_tokens = int(usage.get("completion_tokens") or 0)
            if settings.FAIRGATE_BILLING:
                locked.charge = charge_settle(
                    request_id=_ledger_key(line),
                    backend_name=line.backend,
                    prompt_tokens=locked.prompt_tokens,
                    completion_tokens=locked.completion_tokens,
                )
            locked.state = State.COMPLETED
        else:
            if settings.FAIRGATE_BILLING:
                hold_release(request_id=_ledger_key(line), reason="upstream_error")
            locked.state = State.FAILED
            locked.error = {"code": "upstream_error", "message": f"The backend answered {status}."}
        locked.save()


@shared_task(name="batches.run_line", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_line(line_pk: int, send: int = 0) -> None:
    line = BatchLine.objects.select_related("batch", "batch__tenant", "content").filter(pk=line_pk).first()
    if line is None or line.state != State.SENT:
        return  # ended already: a redelivered task
    if not line_start(line_pk, send or line.sends):
        log.info("batch line %s: send %s is not the line's to run (another run has it)", line_pk, send)
        return
    with renewer.holding(line_pk, send or line.sends):
        _run(line)


def _run(line: BatchLine) -> None:
    backend = Backend.objects.filter(name=line.backend).first()
    payload = line_payload(line)
    try:
        if backend is None:
            raise httpx.ConnectError(f"backend {line.backend!r} is no longer configured")
        spec, body = backend_spec_of(backend), upstream_body(payload)
        response = upstream.client().post(
            f"{spec.url.rstrip('/')}{upstream_path(spec, payload.upstream_path, body)}",
            content=body,
            headers={"Content-Type": "application/json", "X-Request-Id": service.public_id_of(line)}
            | upstream_headers(spec),  # its key and extra headers, from this worker's environment
        )
    except (httpx.HTTPError, CredentialMissing) as failed:
        log.warning("batch line %s: the backend failed: %s", line.pk, failed)
        _finish(line, status=502, body={"error": {"message": str(failed), "code": "upstream_error"}}, usage=None)
        return
    if response.status_code in (401, 403):  # the gateway's key, refused: its answer may echo part of it
        log.error(
            "batch line %s: backend %s: upstream credential refused (%s)", line.pk, spec.name, response.status_code
        )
        message = f"Upstream credential problem: backend '{spec.name}' refused the gateway's credential."
        _finish(line, status=502, body={"error": {"message": message, "code": "upstream_error"}}, usage=None)
        return
    try:  # stored as PostgreSQL can store it (a NUL or NaN in a model's answer does not wedge the line)
        answer = json_storable(response.content)
    except JsonRefused:
        text = response.text[:1000].replace(NUL, REPLACEMENT)
        answer = {"error": {"message": text, "code": "upstream_error"}}
    if not response.is_success:
        _finish(line, status=response.status_code, body=answer, usage=None)
        return
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):  # served without a count: charged for the estimated prompt, as over HTTP
        usage = {"prompt_tokens": payload.prompt_tokens or estimate(payload), "completion_tokens": 0}
    _finish(line, status=response.status_code, body=answer, usage=usage)


@shared_task(name="batches.finalize", ignore_result=True)
def finalize(batch_pk: str) -> bool:
    """A batch with no line left to run, finalized (batches.finalize: every line read, the output
    and error files written) in a worker, not in the serving process that noticed it."""
    return batch_finalize(batch_pk)


@shared_task(name="batches.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    """Beat's, every ``FAIRGATE_BATCH_SWEEP_S``: lines of batches past their window expire, batches
    with no line left are finalized (every serving process finalizes too, each second), files past
    their time are deleted."""
    return {
        "lines_expired": service.batches_expire(),
        "batches_finalized": batches_finalize(),
        "files_deleted": files.files_expire(),
    }
