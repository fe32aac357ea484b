"""Batches in the database (synchronous: the API views and the feeder run these off the event loop).

A batch is created whole from a file its lines check (batches.create) or not at all; its lines are
then claimed by gateway processes (`lines_claim`, never twice: a claim is a conditional UPDATE),
sent to Celery workers once granted, and ended by the worker (completed, failed) or here
(cancelled, expired). A batch with no line left to run is then finalized (batches.finalize).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from batches import leases
from batches.files import FileRefused
from batches.forecast import Pool
from batches.models import Batch, BatchLine
from billing.client import owners_released
from gateway.api import ordered_id

WINDOWS = {"24h": timedelta(hours=24)}
State = BatchLine.State
Status = Batch.Status


def batch_id_new() -> str:
    return ordered_id("batch_", 6)


LINE_ID_RE = re.compile(r"batch_[0-9a-f]{24}\.\d+(~\d+)?")  # what `public_id_of` makes


def batch_of_line(public_id: str) -> str | None:
    """The batch whose line runs as ``public_id`` (`public_id_of`), else None."""
    return public_id.partition(".")[0] if LINE_ID_RE.fullmatch(public_id) else None


def public_id_of(line: BatchLine) -> str:
    """The request id a line runs under (its ledger key is the tenant's: gateway.lifecycle). A line
    fed again after its gateway died runs under a new one (``~2``...): the old one may still be
    live in a shared engine until that gateway is known to be gone."""
    base = f"{line.batch_id}.{line.number}"
    return base if line.feeds <= 1 else f"{base}~{line.feeds}"


@dataclass(frozen=True)
class Asked:
    """What creating a batch asks for (checked by `batch_create`)."""

    tenant_id: int
    tenant_slug: str
    key_prefix: str
    input_file_id: str
    endpoint: str
    completion_window: str
    priority_class: str
    metadata: dict | None
    pool: Pool


def batch_get(*, tenant_id: int, batch_id: str) -> Batch:
    found = Batch.objects.filter(tenant_id=tenant_id, id=batch_id).first()
    if found is None:
        raise FileRefused(404, f"No batch '{batch_id[:64]}' of yours.")
    return found


def batches_list(*, tenant_id: int, after: str | None, limit: int) -> tuple[list[Batch], bool]:
    if not 1 <= limit <= 100:
        raise FileRefused(400, "'limit' must be from 1 to 100.")
    rows = Batch.objects.filter(tenant_id=tenant_id)
    if after:
        rows = rows.filter(id__lt=after)
    found = list(rows.order_by("-id")[: limit + 1])
    return found[:limit], len(found) > limit


CANCELLED_ERROR = {"code": "batch_cancelled", "message": "The batch was cancelled."}
EXPIRED_ERROR = leases.EXPIRED


def batch_cancel(*, tenant_id: int, batch_id: str) -> Batch:
    """Stops granting its lines: the ones not yet sent to a worker end cancelled (a gateway that
    claimed one drops it from the engine and releases its hold); the ones running finish. The
    batch is cancelling until none runs, then cancelled (batches.finalize)."""
    with transaction.atomic():
        batch = batch_get(tenant_id=tenant_id, batch_id=batch_id)
        if batch.status != Status.IN_PROGRESS:
            return batch
        batch.status, batch.cancelling_at = Status.CANCELLING, timezone.now()
        batch.save(update_fields=["status", "cancelling_at"])
        BatchLine.objects.filter(batch=batch, state=State.PENDING).update(
            state=State.CANCELLED, ended_at=timezone.now(), error=CANCELLED_ERROR
        )
    return batch


def counts_of(batch: Batch) -> dict[str, int]:
    """request_counts: one count per state in SQL (the index on batch and state covers it)."""
    by_state = dict(batch.lines.order_by().values_list("state").annotate(n=Count("id")))
    completed = by_state.get(State.COMPLETED, 0)
    ended = sum(by_state.get(state, 0) for state in BatchLine.ENDED)
    return {"total": sum(by_state.values()), "completed": completed, "failed": ended - completed}


CARDS_ENDED_S = 3600  # ended batches stay on the console's cards this long
CARDS_MAX = 20
WAITING = (State.PENDING, State.CLAIMED)


def batch_cards(tenant_ids: Iterable[int]) -> dict[int, list[dict]]:
    """Each tenant's batches for the console (its open ones, then those ended within the last
    hour; at most ``CARDS_MAX``): progress by line state, charges so far, its cost bound, and its
    ETA to the last line at its own rate so far (before its first line ends: the forecast's)."""
    now = timezone.now()
    open_or_recent = Q(status__in=(Status.IN_PROGRESS, Status.CANCELLING)) | Q(
        finalizing_at__gte=now - timedelta(seconds=CARDS_ENDED_S)
    )
    found = list(Batch.objects.filter(open_or_recent, tenant_id__in=list(tenant_ids)).order_by("-id"))
    by_batch: dict[str, dict[str, int]] = {}
    rows = BatchLine.objects.filter(batch__in=[b.id for b in found]).order_by().values_list("batch_id", "state")
    for batch_id, state, n in rows.annotate(n=Count("id")):
        by_batch.setdefault(batch_id, {})[state] = n
    sums = BatchLine.objects.filter(batch__in=[b.id for b in found]).order_by().values_list("batch_id")
    charged = dict(sums.annotate(total=Sum("charge")))
    failures = _failures([b.id for b in found if any(by_batch.get(b.id, {}).get(s) for s in FAILED)])
    cards: dict[int, list[dict]] = {}
    for batch in found:
        states = by_batch.get(batch.id, {})
        card = _card(batch, states, charged.get(batch.id), now)
        card["failed_by_reason"], card["failures"] = failures.get(batch.id, ([], []))
        if len(cards.setdefault(batch.tenant_id, [])) < CARDS_MAX:
            cards[batch.tenant_id].append(card)
    return cards


FAILED = (State.FAILED, State.EXPIRED)  # ended without an answer (a cancelled line is counted as cancelled)
FAILURES_SHOWN = 10


def _failures(batch_ids: list[str]) -> dict[str, tuple[list[dict], list[dict]]]:
    """Per batch: its failed and expired lines by error code (most first) and its latest ones,
    each with the request id it ran under (a console card links each to it)."""
    out: dict[str, tuple[list[dict], list[dict]]] = {}
    lines = BatchLine.objects.filter(batch__in=batch_ids, state__in=FAILED).order_by()
    for batch_id, code, n in lines.values_list("batch_id", "error__code").annotate(n=Count("id")):
        out.setdefault(batch_id, ([], []))[0].append({"reason": code or "unknown", "count": n})
    for batch_id, (by_reason, latest) in out.items():
        by_reason.sort(key=lambda r: (-r["count"], r["reason"]))
        recent = lines.filter(batch_id=batch_id).order_by("-ended_at", "-number")[:FAILURES_SHOWN]
        for line in recent.only("batch_id", "number", "feeds", "error"):
            latest.append({"id": public_id_of(line), "reason": (line.error or {}).get("code") or "unknown"})
    return out


def _description(metadata) -> str:
    """What the client said the batch is (its ``metadata`` description), else ""."""
    if isinstance(metadata, dict) and isinstance(metadata.get("description"), str):
        return metadata["description"][:500]
    return ""


def _card(batch: Batch, states: dict[str, int], charged, now) -> dict:
    total = sum(states.values())
    completed = states.get(State.COMPLETED, 0)
    ended = sum(states.get(s, 0) for s in BatchLine.ENDED)
    left = total - ended
    forecast = batch.forecast or {}
    eta_s: int | None = None
    if batch.status in (Status.IN_PROGRESS, Status.CANCELLING) and left:
        elapsed_s = max((now - batch.created_at).total_seconds(), 1.0)
        if ended:
            eta_s = round(left * elapsed_s / ended)
        elif forecast.get("done_in_s") is not None:
            eta_s = max(0, round(forecast["done_in_s"] - elapsed_s))
    return {
        "id": batch.id,
        "status": batch.status,
        "endpoint": batch.endpoint,
        "class": batch.priority_class,
        "description": _description(batch.metadata),
        "created_at": _ts(batch.created_at),
        "expires_at": _ts(batch.expires_at),
        "total": total,
        "completed": completed,
        "failed": states.get(State.FAILED, 0),  # each line once, under its true state
        "cancelled": states.get(State.CANCELLED, 0),
        "expired": states.get(State.EXPIRED, 0),
        "running": states.get(State.SENT, 0),
        "waiting": sum(states.get(s, 0) for s in WAITING),
        "charged": str(charged or 0),
        "cost_bound": forecast.get("cost_bound"),
        "eta_s": eta_s,
        "fits_window": forecast.get("fits_window"),
        "cancellable": batch.status == Status.IN_PROGRESS,
    }


def _ts(value) -> int | None:
    return None if value is None else int(value.timestamp())


def batch_object(batch: Batch) -> dict:
    """The batch as OpenAI's API shows it."""
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.created_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": None,
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": counts_of(batch),
        "metadata": batch.metadata,
        "forecast": batch.forecast,  # Fairgate's (batches.forecast): not in OpenAI's object
    }


# --- the feeder's side (batches.feeder) ------------------------------------------------------


def lines_claim(*, owner: str, room: int, after: str = "") -> list[BatchLine]:
    """Up to ``room`` pending lines of batches in progress, shared out by tenant first (each tenant
    with an open batch gets an equal part of ``room``, split between its batches; oldest lines first
    within a batch), so every department's batch has lines in the engine and the engine's fairness
    decides between them — a department with ten batches does not get ten parts. Batches are taken
    in id order starting after ``after`` (the last batch the caller claimed from), so when there are
    more tenants than ``room`` every one comes in turn. Each line is claimed for ``owner`` by a
    conditional UPDATE: a line two processes reach at once goes to one of them."""
    if room <= 0:
        return []
    now = timezone.now()
    open_batches = list(
        Batch.objects.filter(status=Status.IN_PROGRESS, expires_at__gt=now, lines__state=State.PENDING)
        .values_list("id", "tenant_id")
        .distinct()
        .order_by("id")
    )
    open_batches = [b for b in open_batches if b[0] > after] + [b for b in open_batches if b[0] <= after]
    by_tenant: dict[int, list[str]] = {}
    for batch_id, tenant_id in open_batches:
        by_tenant.setdefault(tenant_id, []).append(batch_id)
    share = max(1, room // max(1, len(by_tenant)))
    wanted: list[int] = []
    for batch_ids in list(by_tenant.values())[:room]:
        each = max(1, share // len(batch_ids))
        got: list[int] = []
        for batch_id in batch_ids:
            if len(got) >= share:
                break
            pending = BatchLine.objects.filter(batch_id=batch_id, state=State.PENDING).order_by("number")
            got += pending.values_list("pk", flat=True)[: min(each, share - len(got))]
        wanted += got
    claimed: list[int] = []
    for pk in wanted[:room]:
        if BatchLine.objects.filter(pk=pk, state=State.PENDING).update(
            state=State.CLAIMED, owner=owner, feeds=F("feeds") + 1
        ):
            claimed.append(pk)
    found = BatchLine.objects.select_related("batch", "content").filter(pk__in=claimed)
    return list(found.order_by("batch_id", "number"))


def line_unclaim(pk: int) -> None:
    """Back to pending (the engine had no room for it): claimed again later, by anyone, under the
    same request id (it ended unserved: billing books the next attempt of it)."""
    BatchLine.objects.filter(pk=pk, state=State.CLAIMED).update(state=State.PENDING, owner="", feeds=F("feeds") - 1)


def line_drop(pk: int) -> None:
    """A claimed line leaves its process before its grant (its batch was cancelled, the process
    stops, something failed): back to the batch while the batch runs, else cancelled."""
    line = BatchLine.objects.select_related("batch").filter(pk=pk, state=State.CLAIMED).first()
    if line is None:
        return
    if line.batch.status == Status.IN_PROGRESS:
        line_unclaim(pk)
    else:
        line_end(pk, State.CANCELLED, CANCELLED_ERROR)


def requeue_lines_of_gone_processes() -> int:
    """Claimed lines of gateway processes that are gone (dead for billing, or stopped) and whose
    holds billing has released go back to pending, to be claimed again by a live process (their
    new holds book under the next attempt's key); so do their sent lines no worker runs
    (batches.leases)."""
    released = owners_released()
    back = BatchLine.objects.filter(state=State.CLAIMED, owner__in=released).update(state=State.PENDING, owner="")
    return back + leases.lines_of_the_gone_sent(released)


def line_end(pk: int, state: str, error: dict) -> bool:
    """Ends a line that was not run (refused, cancelled, expired); False if it was ended already."""
    return bool(
        BatchLine.objects.filter(pk=pk, state__in=(State.PENDING, State.CLAIMED)).update(
            state=state, error=error, ended_at=timezone.now()
        )
    )


def batches_open() -> bool:
    """Whether any batch is in progress or cancelling (a quiet feeder asks only this each second)."""
    return Batch.objects.filter(status__in=(Status.IN_PROGRESS, Status.CANCELLING)).exists()


def batches_tally() -> dict[str, dict[str, int]]:
    """Batches by status and lines by state (batches.metrics)."""
    by_status = Batch.objects.order_by().values_list("status").annotate(n=Count("id"))
    by_state = BatchLine.objects.order_by().values_list("state").annotate(n=Count("id"))
    return {"batches": dict(by_status), "lines": dict(by_state)}


def batches_cancelled(pks: Iterable[int]) -> set[int]:
    """Of claimed lines ``pks``, those whose batch is no longer in progress (cancelled, expired) or
    whose window has ended (they leave the engine: back to pending, where beat expires them)."""
    over = ~Q(batch__status=Status.IN_PROGRESS) | Q(batch__expires_at__lte=timezone.now())
    return set(BatchLine.objects.filter(over, pk__in=list(pks), state=State.CLAIMED).values_list("pk", flat=True))


# --- ending batches -------------------------------------------------------------------------


def batches_expire() -> int:
    """Beat's (batches.sweep): the pending lines of batches past their window end expired (lines
    waiting in an engine leave it at their deadline, the window's end, and come back here; running
    lines finish). Returns how many lines expired."""
    return BatchLine.objects.filter(
        batch__status=Status.IN_PROGRESS, batch__expires_at__lte=timezone.now(), state=State.PENDING
    ).update(state=State.EXPIRED, ended_at=timezone.now(), error=EXPIRED_ERROR)


FINALIZE_STALE_S = 600  # a batch finalizing this long is finalized again (its finalizer stopped)


def batches_ready() -> list[str]:
    """Settles what is left over (lines of gone processes go back to their batch; the pending lines
    of a cancelling batch are cancelled), then the batches with no line left to run, to finalize
    (batches.finalize), and those whose finalizing stopped midway."""
    requeue_lines_of_gone_processes()
    BatchLine.objects.filter(  # went back to pending (no room in the engine) after the cancel
        batch__status=Status.CANCELLING, state=State.PENDING
    ).update(state=State.CANCELLED, ended_at=timezone.now(), error=CANCELLED_ERROR)
    stale = Q(status=Status.FINALIZING, finalizing_at__lte=timezone.now() - timedelta(seconds=FINALIZE_STALE_S))
    candidates = Batch.objects.filter(Q(status__in=(Status.IN_PROGRESS, Status.CANCELLING)) | stale).exclude(
        lines__state__in=(State.PENDING, State.CLAIMED, State.SENT)
    )
    return list(candidates.values_list("pk", flat=True))
