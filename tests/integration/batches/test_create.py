"""A batch is created from what its file's upload check stored (batches.file_check, batches.create):
the create reads the stored lines (it needs neither the file's bytes nor a tokenizer), still
refuses the whole file with a 400 naming its first bad line, and its lines carry their estimate,
bound and output limit to the feeder; request_counts are counted in one query."""

from __future__ import annotations

import json

import pytest
from django.core.files.base import ContentFile

from batches import create, file_check, files, service
from batches.forecast import Pool
from batches.lines import line_payload
from batches.models import BatchFile, BatchLine, FileLine, LineBody
from gateway.payload import estimate
from tests.integration.billing.conftest import make_world

pytestmark = pytest.mark.django_db
CHAT = "/v1/chat/completions"
SERVED = {"m": False, "e": True}


@pytest.fixture
def world():
    return make_world()


def chat_line(custom_id: str, text: str = "hello there", model: str = "m") -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 7}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def _upload(world, lines: list[dict], *, checked: bool = True) -> BatchFile:
    raw = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    stored = files.file_store(tenant_slug="alpha", purpose="batch", upload=ContentFile(raw, name="job.jsonl"))
    found = files.file_record(stored=stored, tenant_id=world["alpha"].pk, key_prefix="k", purpose="batch")
    return file_check.file_lines_check(file_id=found.id) if checked else found


def _create(world, found: BatchFile, endpoint: str = CHAT):
    asked = service.Asked(
        tenant_id=world["alpha"].pk,
        tenant_slug="alpha",
        key_prefix="k",
        input_file_id=found.id,
        endpoint=endpoint,
        completion_window="24h",
        priority_class="BATCH",
        metadata=None,
        pool=Pool(backends=((frozenset({"m"}), 4),), service_ms=1000.0),
    )
    return create.batch_create(asked, served=SERVED)


def test_the_create_reads_the_stored_check_and_not_the_files_bytes(world):
    lines = [chat_line("a", "one two three four"), chat_line("b", "five")]
    found = _upload(world, lines)
    assert (found.check_error, found.endpoint) == ("", CHAT)
    files.files_storage().delete(found.storage_name)  # the bytes are gone: only the stored lines remain
    batch = _create(world, found)
    made = list(BatchLine.objects.filter(batch=batch).select_related("batch", "content").order_by("number"))
    assert [(line.number, line.custom_id, line.state) for line in made] == [(1, "a", "pending"), (2, "b", "pending")]
    assert [line.content.body for line in made] == [line["body"] for line in lines]
    for line in made:
        payload = line_payload(line)
        assert payload.prompt_tokens == line.estimated_tokens == estimate(payload) > 0
        assert payload.output_limit == line.output_limit == 7 and payload.prompt_bound == line.bound_tokens > 0
    assert batch.forecast["slots"] == 4 and float(batch.forecast["cost_bound"]) > 0
    assert service.counts_of(batch) == {"total": 2, "completed": 0, "failed": 0}


def test_the_first_bad_line_refuses_the_create_whichever_check_found_it(world):
    structural = [chat_line("a"), chat_line("b"), {**chat_line("c"), "method": "GET"}]
    found = _upload(world, structural)
    assert found.check_error_line == 3
    assert list(FileLine.objects.filter(file=found).values_list("number", flat=True).order_by("number")) == [1, 2]
    with pytest.raises(files.FileRefused) as refused:
        _create(world, found)
    assert refused.value.status == 400 and "Line 3: 'method' must be POST." in refused.value.message
    unknown_model_first = [chat_line("a"), chat_line("b", model="nope"), {**chat_line("c"), "method": "GET"}]
    with pytest.raises(files.FileRefused) as refused:  # the model is checked at create: line 2 comes first
        _create(world, _upload(world, unknown_model_first))
    assert "Line 2: unknown model 'nope'" in refused.value.message
    with pytest.raises(files.FileRefused) as refused:  # lines naming another endpoint than the batch's
        _create(world, _upload(world, [chat_line("a")]), endpoint="/v1/embeddings")
    assert "Line 1: 'url' must be the batch's endpoint /v1/embeddings" in refused.value.message
    mixed = [chat_line("a"), {**chat_line("b"), "url": "/v1/embeddings"}]
    assert _upload(world, mixed).check_error.startswith("Line 2: 'url' must be the batch's endpoint /v1/chat/")
    assert not BatchLine.objects.exists()  # nothing accepted in part


def test_a_file_not_checked_at_upload_is_checked_by_the_create(world):
    found = _upload(world, [chat_line("a"), chat_line("b")], checked=False)
    assert found.checked_at is None
    batch = _create(world, found)
    assert BatchFile.objects.get(pk=found.pk).checked_at is not None
    assert list(batch.lines.values_list("custom_id", flat=True).order_by("number")) == ["a", "b"]
    assert LineBody.objects.filter(line__batch=batch).count() == 2


def test_request_counts_are_one_query_of_counts_by_state(world, django_assert_num_queries):
    batch = _create(world, _upload(world, [chat_line(f"c{n}") for n in range(6)]))
    states = ["completed", "completed", "failed", "expired", "sent", "pending"]
    for line, state in zip(batch.lines.order_by("number"), states, strict=True):
        BatchLine.objects.filter(pk=line.pk).update(state=state)
    with django_assert_num_queries(1):
        counts = service.counts_of(batch)
    assert counts == {"total": 6, "completed": 2, "failed": 2}


def test_a_check_written_in_parts_stores_every_line_once_and_a_recheck_replaces_them(world, monkeypatch):
    monkeypatch.setattr(file_check, "PART_ROWS", 2)  # five lines: parts of 2, 2 and 1
    found = _upload(world, [chat_line(f"c{n}") for n in range(5)])
    again = file_check.file_lines_check(file_id=found.id)
    numbers = FileLine.objects.filter(file=found).order_by("number").values_list("number", "custom_id")
    assert list(numbers) == [(n + 1, f"c{n}") for n in range(5)]
    assert again.checked_at > found.checked_at and again.check_error == ""
