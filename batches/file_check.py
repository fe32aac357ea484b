"""A batch input file's lines, checked once, when the file is uploaded: parsed as the gateway would
parse each request (batches.lines), its prompt estimated and bounded, the results stored a row per
line (FileLine), so that a create only reads them and the feeder never tokenizes a line. A file
that does not check is still stored, with its first bad line recorded. The check runs in a process
of its own (batches.check_process): docs/batches.md, "Creating a batch".
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from batches.files import file_chunks
from batches.lines import URLS, Line, LineRefused, lines_read
from batches.models import BatchFile, FileLine
from gateway.api import estimate, output_tokens_held, prompt_bound

PART_ROWS = 200  # lines written per transaction (its size at the surge's lines: bench/REPORT-gateway.md)


def file_lines_check(*, file_id: str) -> BatchFile:
    """Checks the file's lines and stores the result (again, if it was checked before): its lines,
    or its first bad line's number and message (and the good lines before it). The lines are
    written a few hundred at a time, each part in a short transaction of its own (on SQLite a
    long one would hold the database's write lock for the whole check); the file counts as
    checked only once the last part is in (``checked_at``, set last). Returns the file as stored."""
    found = BatchFile.objects.get(pk=file_id)
    with transaction.atomic():
        BatchFile.objects.filter(pk=file_id).update(checked_at=None, check_error="", check_error_line=None, endpoint="")
        FileLine.objects.filter(file_id=file_id).delete()
    error, error_line, endpoint = "", None, ""
    part: list[FileLine] = []
    try:
        for line in lines_read(file_chunks(found), endpoint=None, served=None):
            endpoint = endpoint or URLS[line.payload.kind]
            part.append(_row(file_id, line))
            if len(part) == PART_ROWS:
                _write(part)
    except LineRefused as refused:
        error, error_line = refused.message, refused.line
    _write(part)
    found.checked_at, found.check_error, found.check_error_line = timezone.now(), error, error_line
    found.endpoint = endpoint
    found.save(update_fields=["checked_at", "check_error", "check_error_line", "endpoint"])
    wal_checkpoint()
    return found


def wal_checkpoint() -> None:
    """On SQLite, after writing a large file's lines: their pages moved from the write-ahead log
    into the database now, by this call (a passive checkpoint: it waits for no reader or writer).
    Otherwise the next small commits — a line claimed, sent, ended, by the feeder or a worker —
    each run a part of that checkpoint on its own thread, and a line's slot waits for it."""
    if connection.vendor == "sqlite" and not connection.in_atomic_block:  # (not inside a transaction)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")


def _row(file_id: str, line: Line) -> FileLine:
    payload = line.payload
    return FileLine(
        file_id=file_id,
        number=line.number,
        custom_id=line.custom_id,
        model=payload.model,
        estimated_tokens=estimate(payload),
        bound_tokens=prompt_bound(payload),
        output_limit=payload.output_limit,
        output_tokens=output_tokens_held(payload),
        body=payload.body,
    )


def _write(part: list[FileLine]) -> None:
    with transaction.atomic():
        FileLine.objects.bulk_create(part)
    part.clear()
