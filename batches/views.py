"""The Files API (OpenAI's shape; the `openai` SDK's ``client.files`` works unchanged):
``POST /v1/files`` (multipart: ``file``, ``purpose=batch``), ``GET /v1/files``,
``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``. A tenant sees
its own files only (another tenant's are 404). Storage and database calls run off the event loop;
an uploaded batch file's lines are checked before the upload is answered, in a process of its own
(batches.file_check), and a batch is created in the batches' database thread (batches.create)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from batches import create, files, service
from batches.check_process import file_check_off_process
from batches.client_json import JsonRefused, json_checked, text_checked
from batches.db import batch_db_call
from batches.forecast import Pool
from batches.models import BatchFile
from gateway.api import api_view, authenticate, db_call, dispatcher_get, invalid_request, json_response


async def _upload(request: HttpRequest) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    if not (request.content_type or "").startswith("multipart/form-data"):
        raise invalid_request("Upload a file as multipart/form-data with the fields 'file' and 'purpose'.")
    form, uploaded = await asyncio.to_thread(lambda: (request.POST, request.FILES))  # parsed off the event loop
    upload = uploaded.get("file")
    if upload is None:
        raise invalid_request("The upload has no 'file' field.")
    try:
        keep_s = files.expiry_of(form)
        stored = await asyncio.to_thread(
            files.file_store, tenant_slug=caller.tenant, purpose=form.get("purpose", ""), upload=upload
        )
    finally:  # a large upload's temporary file, which the storage may have moved: closed now, not at GC
        upload.close()
    record = await db_call(files.file_record)(
        stored=stored,
        tenant_id=caller.tenant_id,
        key_prefix=caller.key_prefix,
        purpose=form.get("purpose", ""),
        keep_s=keep_s,
    )
    if record.purpose == BatchFile.Purpose.BATCH:  # its lines checked now, once, off this process
        await file_check_off_process(record.id)
    return json_response(files.file_object(record))


def _page(data: list[dict], *, has_more: bool) -> HttpResponse:
    """A list in OpenAI's cursor shape (the SDK pages with ``after=last_id``)."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return json_response({"object": "list", "data": data, "has_more": has_more, "first_id": first, "last_id": last})


def _param(request: HttpRequest, name: str) -> str | None:
    """A query parameter that reaches the database (no NUL: PostgreSQL refuses it), or None."""
    raw = request.GET.get(name) or None
    try:
        return None if raw is None else text_checked(raw)
    except JsonRefused as refused:
        raise invalid_request(f"'{name}': {refused.reason}") from None


def _path_id(value: str, what: str) -> str:
    """A file or batch id from the path; one holding NUL names nothing (404, not a query)."""
    if "\x00" in value:
        raise files.FileRefused(404, f"No {what} of yours with that id.")
    return value


def _int_param(request: HttpRequest, name: str, default: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise invalid_request(f"'{name}' must be an integer.") from None


async def _listing(request: HttpRequest) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("'order' must be 'asc' or 'desc'.")
    page = await db_call(files.files_list)(
        tenant_id=caller.tenant_id,
        purpose=_param(request, "purpose"),
        after=_param(request, "after"),
        limit=_int_param(request, "limit", 100),
        ascending=order == "asc",
    )
    data = [files.file_object(f) for f in page.files]
    return _page(data, has_more=page.has_more)


@api_view("GET", "POST")
async def files_view(request: HttpRequest) -> HttpResponse:
    return await (_upload(request) if request.method == "POST" else _listing(request))


async def _found(request: HttpRequest, file_id: str) -> BatchFile:
    caller = await authenticate(request.headers.get("Authorization"))
    return await db_call(files.file_get)(tenant_id=caller.tenant_id, file_id=_path_id(file_id, "file"))


@api_view("GET", "DELETE")
async def file_detail(request: HttpRequest, file_id: str) -> HttpResponse:
    found = await _found(request, file_id)
    if request.method == "GET":
        return json_response(files.file_object(found))
    await db_call(files.file_delete)(tenant_id=found.tenant_id, file_id=found.id)
    return json_response({"id": found.id, "object": "file", "deleted": True})


async def _streamed(found: BatchFile) -> AsyncIterator[bytes]:
    chunks = files.file_chunks(found)
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
    finally:
        await asyncio.to_thread(chunks.close)


@api_view("GET")
async def file_content(request: HttpRequest, file_id: str) -> StreamingHttpResponse:
    found = await _found(request, file_id)
    response = StreamingHttpResponse(_streamed(found), content_type="application/octet-stream")
    response["Content-Length"] = str(found.bytes)
    response["Content-Disposition"] = f'attachment; filename="{found.id}.jsonl"'
    return response


# --- batches ----------------------------------------------------------------------------------

BATCH_CLASS = "BATCH"


def _priority_class(d, caller, metadata: dict | None) -> str:
    """The class a batch's lines declare: BATCH, or ``metadata.priority_class`` if the key may
    declare it and it is no higher than BATCH."""
    asked = (metadata or {}).get("priority_class", BATCH_CLASS)
    levels = d.queue_view().class_levels()
    if not isinstance(asked, str) or asked not in levels or BATCH_CLASS not in levels:
        raise invalid_request(f"'metadata.priority_class' must name a class; got {str(asked)[:64]!r}.")
    if levels[asked] < levels[BATCH_CLASS]:
        raise invalid_request(f"A batch runs in {BATCH_CLASS} or a lower class, not {asked}.")
    if caller.allowed_classes and asked not in caller.allowed_classes:
        raise invalid_request(f"Your key may not declare {asked}.")
    return asked


def _json_body(request: HttpRequest) -> dict:
    """The body as a JSON object PostgreSQL can store (batches.client_json), else 400."""
    try:
        body = json_checked(request.body or b"{}")
    except JsonRefused as refused:
        raise invalid_request(f"The request body is refused: {refused.reason}") from None
    if not isinstance(body, dict):
        raise invalid_request("The request body must be a JSON object.")
    return body


METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512  # OpenAI's bounds


def _metadata(body: dict) -> dict | None:
    """``metadata`` as OpenAI takes it: at most 16 pairs, string keys (64) and string values (512)."""
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > METADATA_PAIRS:
        raise invalid_request(f"'metadata' must be an object of at most {METADATA_PAIRS} pairs.")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY or not isinstance(value, str) or len(value) > METADATA_VALUE:
            raise invalid_request(
                f"'metadata' keys are strings of at most {METADATA_KEY} characters and its values strings of "
                f"at most {METADATA_VALUE}; '{key[:64]}' is not."
            )
    return metadata


async def _batch_create(request: HttpRequest) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    body = _json_body(request)
    metadata = _metadata(body)
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise invalid_request(f"'{name}' is required (a string).")
    d = await dispatcher_get()
    view = d.queue_view()
    served = {m: m in b.embedding_models for b in view.backends().values() for m in b.models}
    priority_class = _priority_class(d, caller, metadata)
    pool = Pool(
        backends=tuple(
            (frozenset(b.models), max(0, b.slots - b.reserved_slots)) for b in view.backends().values() if b.enabled
        ),
        service_ms=view.service_ms(priority_class),
    )
    asked = service.Asked(
        tenant_id=caller.tenant_id,
        tenant_slug=caller.tenant,
        key_prefix=caller.key_prefix,
        input_file_id=body["input_file_id"],
        endpoint=body["endpoint"],
        completion_window=body["completion_window"],
        priority_class=priority_class,
        metadata=metadata,
        pool=pool,
    )
    batch = await batch_db_call(create.batch_create)(asked, served=served)
    return json_response(await db_call(service.batch_object)(batch))


async def _batches_listing(request: HttpRequest) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    found, more = await db_call(service.batches_list)(
        tenant_id=caller.tenant_id, after=_param(request, "after"), limit=_int_param(request, "limit", 20)
    )
    data = await db_call(lambda: [service.batch_object(b) for b in found])()
    return _page(data, has_more=more)


@api_view("GET", "POST")
async def batches_view(request: HttpRequest) -> HttpResponse:
    return await (_batch_create(request) if request.method == "POST" else _batches_listing(request))


@api_view("GET")
async def batch_detail(request: HttpRequest, batch_id: str) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    batch = await db_call(service.batch_get)(tenant_id=caller.tenant_id, batch_id=_path_id(batch_id, "batch"))
    return json_response(await db_call(service.batch_object)(batch))


@api_view("POST")
async def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    batch = await db_call(service.batch_cancel)(tenant_id=caller.tenant_id, batch_id=_path_id(batch_id, "batch"))
    return json_response(await db_call(service.batch_object)(batch))
