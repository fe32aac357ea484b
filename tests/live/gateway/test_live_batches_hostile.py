"""The Batch API against input PostgreSQL cannot store, over HTTP on the real stack: a batch file's
line holding a NUL character is refused with a 400 naming the line (every time), and other files
still make batches; NaN, Infinity, deep nesting or NUL in a create's body, a body that is not an
object, and NUL in a query or path parameter are 400 (or 404), never a 500."""

from __future__ import annotations

import json

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.live.gateway.test_live_batches import chat_line, upload
from tests.support.livestack import start_gateway
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live
CHAT = "/v1/chat/completions"
CREATE = {"endpoint": CHAT, "completion_window": "24h"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=2, tokens_per_s=5000, seed=3))
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("fin", share=0.5)],
        backends=[backend("b", f"{sim.url}/v1", models=("m",), slots=2)],
    )
    gateway = start_gateway(tmp_path_factory.mktemp("gw-batches-hostile"), yaml, {"fin": ("fin", "BATCH")})
    yield gateway
    gateway.stop()
    sim.stop()


def test_a_line_with_nul_is_refused_naming_it_and_other_files_still_make_batches(stack):
    sdk = stack.sdk("fin")
    raw = b"".join(json.dumps(line).encode() + b"\n" for line in (chat_line("a"), chat_line("b", "x\x00y")))
    assert b"\\u0000" in raw  # the escape, as a client writes it
    hostile = sdk.files.create(file=("job.jsonl", raw), purpose="batch").id
    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.batches.create(input_file_id=hostile, **CREATE)
        assert "Line 2: " in refused.value.message and "NUL" in refused.value.message
    batch = sdk.batches.create(input_file_id=upload(sdk, [chat_line("c")]), **CREATE)
    assert batch.status == "in_progress" and batch.request_counts.total == 1


def _create_raw(http, body: bytes):
    return http.post("/v1/batches", content=body, headers={"Content-Type": "application/json"})


def test_a_create_body_postgres_cannot_store_is_a_400_never_a_500(stack):
    sdk = stack.sdk("fin")
    file_id = upload(sdk, [chat_line("a")])
    start = json.dumps({"input_file_id": file_id, **CREATE})[:-1]
    bodies = {
        "NaN": start + ', "metadata": {"note": NaN}}',
        "Infinity": start + ', "metadata": {"note": [Infinity]}}',
        "out of range": start + ', "metadata": {"note": 1e400}}',
        "nested deep": start + ', "metadata": {"note": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        "nested": start + ', "metadata": {"note": {"deeper": "x"}}}',
        "nul in metadata": start + ', "metadata": {"note": "a\\u0000b"}}',
        "nul in a key": start + ', "metadata": {"n\\u0000": "a"}}',
        "nul in the file id": json.dumps({"input_file_id": file_id + "\x00", **CREATE}),
        "a list": "[1, 2]",
        "a string": '"batch"',
    }
    with stack.http("fin", timeout=30) as http:
        for name, body in bodies.items():
            answer = _create_raw(http, body.encode())
            assert answer.status_code == 400, (name, answer.status_code, answer.text[:300])
            assert answer.json()["error"]["code"] == "invalid_request", name
        for path in ("/v1/files?after=%00", "/v1/batches?after=%00", "/v1/files?purpose=%00"):
            assert http.get(path).status_code == 400, path
        for path in ("/v1/files/file-%00", "/v1/batches/batch_%00", "/v1/files/file-%00/content"):
            assert http.get(path).status_code == 404, path
        assert http.post("/v1/batches/batch_%00/cancel").status_code == 404
        ok = _create_raw(http, (start + ', "metadata": {"note": "fine"}}').encode())
        assert ok.status_code == 200 and ok.json()["metadata"] == {"note": "fine"}
