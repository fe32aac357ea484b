"""A batch's end: its output and error files written in OpenAI's line format, its status set.

A batch with no line left to run is claimed for finalizing under a short row lock (status
finalizing, ``finalizing_at`` the claim); its lines are then read a part at a time, in their
order in the input file, and streamed into the files storage (batches.files.file_write), with no
lock held and no list of all lines in memory; the files are recorded and the status set under the
row lock again, only if the claim is still this one. A finalizer that stops midway leaves the
batch finalizing: after FINALIZE_STALE_S it is ready again (batches.service.batches_ready) and
claimed anew; the old finalizer, if it was only slow, finds its claim gone and deletes what it
wrote. So a batch gets exactly one output file and one error file, however many finalize it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from batches.files import Stored, file_record, file_write, files_storage
from batches.models import Batch, BatchFile, BatchLine
from batches.service import FINALIZE_STALE_S, batches_ready, public_id_of

State = BatchLine.State
Status = Batch.Status
PART_LINES = 500  # lines read per query while writing
LINE_FIELDS = ("pk", "batch_id", "number", "custom_id", "feeds", "status_code", "response", "error")


def _output_line(line: BatchLine) -> bytes:
    """A line of the output or error file, in OpenAI's format."""
    response = None
    if line.status_code is not None:
        response = {"status_code": line.status_code, "request_id": public_id_of(line), "body": line.response}
    record = {"id": f"batch_req_{line.pk}", "custom_id": line.custom_id, "response": response, "error": line.error}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _lines(batch_id: str, *, completed: bool) -> Iterator[bytes]:
    """The batch's completed lines (else: its other lines) as file lines, in input order, read
    PART_LINES at a time (keyset on number, then pk)."""
    rows = BatchLine.objects.filter(batch_id=batch_id).only(*LINE_FIELDS)
    rows = rows.filter(state=State.COMPLETED) if completed else rows.exclude(state=State.COMPLETED)
    after: tuple[int, int] | None = None
    while True:
        page = rows
        if after is not None:
            page = rows.filter(Q(number__gt=after[0]) | Q(number=after[0], pk__gt=after[1]))
        part = list(page.order_by("number", "pk")[:PART_LINES])
        yield b"".join(_output_line(line) for line in part)
        if len(part) < PART_LINES:
            return
        after = (part[-1].number, part[-1].pk)


def _claim(pk: str, now: datetime) -> Batch | None:
    """The batch, now finalizing under this claim (``finalizing_at`` = ``now``); None if it is not
    ready (a line left to run), ended, or being finalized by a claim not yet stale."""
    with transaction.atomic():
        locked = Batch.objects.select_for_update().filter(pk=pk).first()
        if locked is None:
            return None
        stale = locked.status == Status.FINALIZING and (
            locked.finalizing_at is None or locked.finalizing_at <= now - timedelta(seconds=FINALIZE_STALE_S)
        )
        if locked.status not in (Status.IN_PROGRESS, Status.CANCELLING) and not stale:
            return None
        if locked.lines.exclude(state__in=BatchLine.ENDED).exists():
            return None
        locked.status, locked.finalizing_at = Status.FINALIZING, now
        locked.save(update_fields=["status", "finalizing_at"])
    return locked


def _record(batch: Batch, claimed_at: datetime, output: Stored | None, errors: Stored | None) -> bool:
    """The files recorded and the status set, if the claim is still this one."""
    with transaction.atomic():
        locked = Batch.objects.select_for_update().filter(pk=batch.pk).first()
        if locked is None or locked.status != Status.FINALIZING or locked.finalizing_at != claimed_at:
            return False
        for stored, field in ((output, "output_file"), (errors, "error_file")):
            if stored is not None:
                setattr(locked, field, _file_row(locked, stored))
        ended = timezone.now()
        if locked.cancelling_at is not None:
            locked.status, locked.cancelled_at = Status.CANCELLED, ended
        elif locked.lines.filter(state=State.EXPIRED).exists():
            locked.status, locked.expired_at = Status.EXPIRED, ended
        else:
            locked.status, locked.completed_at = Status.COMPLETED, ended
        locked.save()
    return True


def _file_row(batch: Batch, stored: Stored) -> BatchFile:
    purpose = BatchFile.Purpose.BATCH_OUTPUT
    return file_record(stored=stored, tenant_id=batch.tenant_id, key_prefix=batch.key_prefix, purpose=purpose)


def batch_finalize(pk: str) -> bool:
    """Finalizes the batch ``pk`` if no line of it is left to run: its output and error files
    written, its status set (cancelled if it was cancelling, expired if a line expired, else
    completed). The heavy part of a batch's end (every line read), so serving processes hand it to
    a worker (``batches.finalize``). Returns whether it was finalized now (False: not ready, done
    already, or finalized by another claim)."""
    claimed_at = timezone.now()
    batch = _claim(pk, claimed_at)
    if batch is None:
        return False
    slug = batch.tenant.slug
    written: list[Stored] = []
    recorded = False
    try:
        output = file_write(tenant_slug=slug, filename=f"{pk}_output.jsonl", chunks=_lines(pk, completed=True))
        written += [output] if output else []
        errors = file_write(tenant_slug=slug, filename=f"{pk}_errors.jsonl", chunks=_lines(pk, completed=False))
        written += [errors] if errors else []
        recorded = _record(batch, claimed_at, output, errors)
    finally:
        if not recorded:  # failed, or another claim finalized it: what this one wrote is not kept
            for stored in written:
                files_storage().delete(stored.storage_name)
    return recorded


def batches_finalize() -> int:
    """Finalizes every batch with no line left to run (`batch_finalize`); returns how many."""
    return sum(batch_finalize(pk) for pk in batches_ready())
