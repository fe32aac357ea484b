"""The Files API (OpenAI's shape; the `openai` SDK's ``client.files`` works unchanged):
``POST /v1/files`` (multipart: ``file``, ``purpose=batch``), ``GET /v1/files``,
``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``. A tenant sees
its own files only (another tenant's are 404). Storage and database calls run off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from batches import files
from batches.models import BatchFile
from gateway.auth import authenticate
from gateway.db import db_call
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.views import api_view, json_response


def _refused(refused: files.FileRefused) -> GatewayError:
    code = {404: ErrorCode.NOT_FOUND, 413: ErrorCode.REQUEST_TOO_LARGE}.get(refused.status, ErrorCode.INVALID_REQUEST)
    return GatewayError(refused.status, code, refused.message)


async def _upload(request: HttpRequest) -> HttpResponse:
    caller = await authenticate(request.headers.get("Authorization"))
    if not (request.content_type or "").startswith("multipart/form-data"):
        raise invalid_request("Upload a file as multipart/form-data with the fields 'file' and 'purpose'.")
    form, uploaded = await asyncio.to_thread(lambda: (request.POST, request.FILES))  # parsed off the event loop
    upload = uploaded.get("file")
    if upload is None:
        raise invalid_request("The upload has no 'file' field.")
    try:
        stored = await asyncio.to_thread(
            files.file_store, tenant_slug=caller.tenant, purpose=form.get("purpose", ""), upload=upload
        )
        record = await db_call(files.file_record)(
            stored=stored, tenant_id=caller.tenant_id, key_prefix=caller.key_prefix, purpose=form.get("purpose", "")
        )
    except files.FileRefused as refused:
        raise _refused(refused) from None
    return json_response(files.file_object(record))


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
    try:
        page = await db_call(files.files_list)(
            tenant_id=caller.tenant_id,
            purpose=request.GET.get("purpose") or None,
            after=request.GET.get("after") or None,
            limit=_int_param(request, "limit", 100),
            ascending=order == "asc",
        )
    except files.FileRefused as refused:
        raise _refused(refused) from None
    data = [files.file_object(f) for f in page.files]
    return json_response(
        {
            "object": "list",
            "data": data,
            "has_more": page.has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


@api_view("GET", "POST")
async def files_view(request: HttpRequest) -> HttpResponse:
    return await (_upload(request) if request.method == "POST" else _listing(request))


async def _found(request: HttpRequest, file_id: str) -> BatchFile:
    caller = await authenticate(request.headers.get("Authorization"))
    try:
        return await db_call(files.file_get)(tenant_id=caller.tenant_id, file_id=file_id)
    except files.FileRefused as refused:
        raise _refused(refused) from None


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
