"""The Files API through the real gateway with the official openai SDK: upload (``purpose=batch``),
read back, list with its cursor, download, delete; a tenant sees only its own files; limits are
refused with a clear answer before anything is stored."""

from __future__ import annotations

import io
import json
import socket

import httpx
import openai
import pytest

from tests.support.livestack import start_gateway
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

KEYS = {"fin": ("fin", "BATCH"), "ops": ("ops", "BATCH")}
MAX_BYTES = 4096
MAX_LINES = 20


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("fin"), tenant("ops")],
        backends=[backend("b", "http://127.0.0.1:9/v1")],
    )
    running = start_gateway(
        tmp_path_factory.mktemp("gw-files"),
        yaml,
        KEYS,
        FAIRGATE_FILE_MAX_BYTES=str(MAX_BYTES),
        FAIRGATE_BATCH_MAX_LINES=str(MAX_LINES),
    )
    yield running
    running.stop()


def jsonl(count: int) -> bytes:
    line = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
    return b"".join(json.dumps({"custom_id": f"r{i}", **line}).encode() + b"\n" for i in range(count))


def test_upload_read_list_download_delete(gateway):
    sdk = gateway.sdk("fin")
    content = jsonl(3)
    created = sdk.files.create(file=("report.jsonl", io.BytesIO(content)), purpose="batch")
    assert created.id.startswith("file-")
    assert (created.bytes, created.filename, created.purpose, created.status) == (
        len(content),
        "report.jsonl",
        "batch",
        "processed",
    )
    assert sdk.files.retrieve(created.id).bytes == len(content)
    assert sdk.files.content(created.id).read() == content
    assert created.id in [f.id for f in sdk.files.list(purpose="batch")]
    deleted = sdk.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.files.content(created.id)


def test_an_upload_expires_when_it_asks_and_else_after_the_ttl(gateway):
    sdk = gateway.sdk("fin")
    asked = sdk.files.create(
        file=("short.jsonl", io.BytesIO(jsonl(1))),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert asked.expires_at == asked.created_at + 7200
    kept = sdk.files.create(file=("kept.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    assert kept.expires_at == kept.created_at + 30 * 24 * 3600  # FAIRGATE_FILE_TTL_S's default
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.files.create(
            file=("x.jsonl", io.BytesIO(jsonl(1))),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 5},
        )
    assert "expires_after" in refused.value.message


def test_the_list_pages_with_its_cursor_newest_first(gateway):
    sdk = gateway.sdk("ops")
    made = [sdk.files.create(file=(f"f{i}.jsonl", io.BytesIO(jsonl(1))), purpose="batch").id for i in range(5)]
    first = sdk.files.list(limit=2)
    assert [f.id for f in first.data] == made[::-1][:2] and first.has_more
    walked = [f.id for f in sdk.files.list(limit=2)]  # iterating a page follows the cursor to the end
    assert walked == made[::-1]
    oldest_first = sdk.files.list(limit=10, order="asc")
    assert [f.id for f in oldest_first.data] == made


def test_a_tenant_sees_only_its_own_files(gateway):
    theirs = gateway.sdk("fin").files.create(file=("x.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    other = gateway.sdk("ops")
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(theirs.id)
    with pytest.raises(openai.NotFoundError):
        other.files.delete(theirs.id)
    assert theirs.id not in [f.id for f in other.files.list()]
    assert gateway.sdk("fin").files.retrieve(theirs.id).id == theirs.id


@pytest.mark.parametrize(
    "content, purpose, status, fragment",
    [
        (b"", "batch", 400, "empty"),
        (jsonl(MAX_LINES + 1), "batch", 400, "FAIRGATE_BATCH_MAX_LINES"),
        (b"x" * (MAX_BYTES + 1), "batch", 413, "FAIRGATE_FILE_MAX_BYTES"),
        (jsonl(1), "fine-tune", 400, "'purpose'"),
    ],
)
def test_uploads_past_the_limits_are_refused_and_nothing_is_stored(gateway, content, purpose, status, fragment):
    sdk = gateway.sdk("fin")
    before = {f.id for f in sdk.files.list()}
    with pytest.raises(openai.APIStatusError) as refused:
        sdk.files.create(file=("bad.jsonl", io.BytesIO(content)), purpose=purpose)
    assert refused.value.status_code == status
    assert fragment in refused.value.message
    assert {f.id for f in sdk.files.list()} == before


def test_an_upload_declaring_more_than_a_file_may_be_is_refused_before_its_body_is_read(gateway):
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            (
                "POST /v1/files HTTP/1.1\r\n"
                f"Host: {host}\r\nAuthorization: Bearer {gateway.keys['fin']}\r\n"
                "Content-Type: multipart/form-data; boundary=x\r\n"
                f"Content-Length: {10 * MAX_BYTES + 100_000}\r\n\r\n--x\r\n"
            ).encode()
        )  # the rest of the body never comes: the answer must not wait for it
        answer = b""
        while chunk := conn.recv(4096):  # until the gateway closes the connection (Connection: close)
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"code": "request_too_large"' in answer


def test_an_upload_needs_a_key_and_a_form(gateway):
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        assert (
            http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"}).status_code == 401
        )
        keyed = {"Authorization": f"Bearer {gateway.keys['fin']}"}
        not_a_form = http.post("/v1/files", headers=keyed, json={"purpose": "batch"})
        assert not_a_form.status_code == 400 and "multipart/form-data" in not_a_form.json()["error"]["message"]
        no_file = http.post("/v1/files", headers=keyed, files={"other": ("a", b"x")}, data={"purpose": "batch"})
        assert no_file.status_code == 400 and "'file'" in no_file.json()["error"]["message"]
