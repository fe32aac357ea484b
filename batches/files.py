"""Files of the Batch API in Django's storage API (``STORAGES["batch_files"]``): the bytes there,
a `BatchFile` row each. Local ``var/files`` is the default, for one machine; gateways on several
machines need a shared storage (an S3-compatible bucket through django-storages' S3 backend).

Uploads are checked for what can be checked without reading them as a batch: purpose, size
(``FAIRGATE_FILE_MAX_BYTES``, else 413) and line count (``FAIRGATE_BATCH_MAX_LINES``); the lines
themselves are checked when a batch is created from the file. Every call here is synchronous (ORM
and storage): the API views run them in a thread.
"""

from __future__ import annotations

import tempfile
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from batches.models import BatchFile
from gateway.api import ErrorCode, GatewayError, ordered_id

STORAGE_ALIAS = "batch_files"
UPLOAD_PURPOSES = (BatchFile.Purpose.BATCH,)
READ_CHUNK_BYTES = 256 * 1024
SPOOL_BYTES = 1024 * 1024  # a file written here is held in memory up to this, then on local disk
MAX_LIST = 10_000


class FileRefused(GatewayError):
    """A file or batch call refused (400, 402, 404, 413), answered to the client as any GatewayError."""

    CODES = {402: ErrorCode.BUDGET_EXHAUSTED, 404: ErrorCode.NOT_FOUND, 413: ErrorCode.REQUEST_TOO_LARGE}

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, self.CODES.get(status, ErrorCode.INVALID_REQUEST), message)


def files_storage() -> Storage:
    return storages[STORAGE_ALIAS]


def file_id_new() -> str:
    """``file-`` + 24 hex digits: the time in ms, then 48 random bits (ids sort as they were made)."""
    return ordered_id("file-", 6)


def _counted(upload: File, *, limited: bool = True) -> tuple[int, int]:
    """(bytes, lines) of ``upload``: lines end with a newline, the last one may not. ``limited``:
    413 past FAIRGATE_FILE_MAX_BYTES."""
    size = lines = 0
    last = b"\n"
    for chunk in upload.chunks(READ_CHUNK_BYTES):
        size += len(chunk)
        lines += chunk.count(b"\n")
        if chunk:
            last = chunk[-1:]
        if limited and size > settings.FAIRGATE_FILE_MAX_BYTES:
            limit = settings.FAIRGATE_FILE_MAX_BYTES
            raise FileRefused(413, f"A file is at most {limit} bytes here (FAIRGATE_FILE_MAX_BYTES).")
    return size, lines + (last != b"\n")


@dataclass(frozen=True)
class Stored:
    """An upload's bytes in the storage, not recorded yet (`file_record`)."""

    file_id: str
    storage_name: str
    filename: str
    bytes: int
    lines: int


def file_store(*, tenant_slug: str, purpose: str, upload: File, checked: bool = True) -> Stored:
    """Checks ``upload`` (not a file the product writes itself: ``checked=False``) and writes it to
    the files storage (no database: may run in any thread)."""
    if not checked:
        size, lines = _counted(upload, limited=False)
    elif purpose not in UPLOAD_PURPOSES:
        raise FileRefused(400, f"'purpose' must be one of: {', '.join(UPLOAD_PURPOSES)}; got '{purpose[:64]}'.")
    else:
        size, lines = _counted(upload)
    if checked and size == 0:
        raise FileRefused(400, "The file is empty: a batch file has one JSON request per line.")
    if checked and lines > settings.FAIRGATE_BATCH_MAX_LINES:
        raise FileRefused(
            400,
            f"A batch file has at most {settings.FAIRGATE_BATCH_MAX_LINES} lines here "
            f"(FAIRGATE_BATCH_MAX_LINES); this one has {lines}.",
        )
    file_id = file_id_new()
    upload.seek(0)
    stored = files_storage().save(f"{tenant_slug}/{file_id}.jsonl", upload)
    return Stored(file_id, stored, (upload.name or "upload.jsonl")[-255:], size, lines)


def file_write(*, tenant_slug: str, filename: str, chunks: Iterable[bytes]) -> Stored | None:
    """A file the product writes (a batch's output), from ``chunks`` as they come: spooled (at
    most SPOOL_BYTES of it in memory), then saved to the files storage, which reads it in parts.
    None if ``chunks`` held no bytes (no database: may run in any thread)."""
    size = lines = 0
    last = b"\n"
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        for chunk in chunks:
            spool.write(chunk)
            size, lines, last = size + len(chunk), lines + chunk.count(b"\n"), chunk[-1:] or last
        if not size:
            return None
        spool.seek(0)
        file_id = file_id_new()
        stored = files_storage().save(f"{tenant_slug}/{file_id}.jsonl", File(spool, name=filename))
    return Stored(file_id, stored, filename[-255:], size, lines + (last != b"\n"))


EXPIRES_AFTER_S = (3600, 30 * 24 * 3600)  # what an upload's expires_after may ask (OpenAI's range)


def expiry_of(form: Mapping[str, str]) -> int:
    """Seconds from now an upload is kept: its ``expires_after`` (``anchor`` created_at, ``seconds``
    in OpenAI's range) or ``FAIRGATE_FILE_TTL_S``."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return settings.FAIRGATE_FILE_TTL_S
    low, high = EXPIRES_AFTER_S
    if anchor != "created_at" or not (seconds or "").isdigit() or not low <= int(seconds or 0) <= high:
        raise FileRefused(
            400,
            f"'expires_after' is {{'anchor': 'created_at', 'seconds': {low} to {high}}}; got {anchor!r}, {seconds!r}.",
        )
    return int(seconds or 0)


def file_record(
    *, stored: Stored, tenant_id: int, key_prefix: str, purpose: str, keep_s: int | None = None
) -> BatchFile:
    """The row of a stored file, kept ``keep_s`` (default ``FAIRGATE_FILE_TTL_S``); if it cannot be
    written, the bytes are removed again."""
    now = timezone.now()
    keep = timedelta(seconds=settings.FAIRGATE_FILE_TTL_S if keep_s is None else keep_s)
    try:
        return BatchFile.objects.create(
            id=stored.file_id,
            tenant_id=tenant_id,
            purpose=purpose,
            filename=stored.filename,
            bytes=stored.bytes,
            lines=stored.lines,
            storage_name=stored.storage_name,
            key_prefix=key_prefix,
            created_at=now,
            expires_at=now + keep,
        )
    except BaseException:
        files_storage().delete(stored.storage_name)
        raise


def _kept():
    """Files not expired (one past its time is gone for the API before beat deletes it)."""
    return BatchFile.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))


def files_expire() -> int:
    """Deletes every file past its time, row and bytes (beat: batches.sweep); returns how many."""
    gone = list(BatchFile.objects.filter(expires_at__lte=timezone.now()).values_list("pk", "storage_name"))
    for pk, storage_name in gone:
        BatchFile.objects.filter(pk=pk).delete()  # batches keep their other fields (the file ids become null)
        files_storage().delete(storage_name)
    return len(gone)


def file_get(*, tenant_id: int, file_id: str) -> BatchFile:
    """The tenant's file, or 404 (another tenant's file is not found either)."""
    found = _kept().filter(tenant_id=tenant_id, id=file_id).first()
    if found is None:
        raise FileRefused(404, f"No file '{file_id[:64]}' of yours.")
    return found


@dataclass(frozen=True)
class Page:
    files: list[BatchFile]
    has_more: bool


def files_list(*, tenant_id: int, purpose: str | None, after: str | None, limit: int, ascending: bool) -> Page:
    if not 1 <= limit <= MAX_LIST:
        raise FileRefused(400, f"'limit' must be from 1 to {MAX_LIST}.")
    rows = _kept().filter(tenant_id=tenant_id)
    if purpose:
        rows = rows.filter(purpose=purpose)
    if after:
        rows = rows.filter(id__gt=after) if ascending else rows.filter(id__lt=after)
    found = list(rows.order_by("id" if ascending else "-id")[: limit + 1])
    return Page(found[:limit], len(found) > limit)


def file_delete(*, tenant_id: int, file_id: str) -> None:
    with transaction.atomic():
        found = file_get(tenant_id=tenant_id, file_id=file_id)
        found.delete()
    files_storage().delete(found.storage_name)


def file_chunks(found: BatchFile) -> Generator[bytes, None, None]:
    """The file's bytes, a chunk at a time (the storage file is closed at the end or on close())."""
    with files_storage().open(found.storage_name, "rb") as stream:
        while chunk := stream.read(READ_CHUNK_BYTES):
            yield chunk


def file_object(found: BatchFile) -> dict:
    """The file as OpenAI's API shows it."""
    return {
        "id": found.id,
        "object": "file",
        "bytes": found.bytes,
        "created_at": int(found.created_at.timestamp()),
        "filename": found.filename,
        "purpose": found.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None if found.expires_at is None else int(found.expires_at.timestamp()),
    }
