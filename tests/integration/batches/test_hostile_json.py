"""JSON that PostgreSQL cannot store never reaches it from batches: a batch file's line holding a
NUL character (the escape \\u0000), NaN, a number out of range or nesting too deep is refused at
upload, naming its line, and a batch from that file is refused with a 400 naming it (a file
uploaded unchecked included), while other files still make batches; a backend's answer holding
NUL or NaN is stored (NUL as U+FFFD, NaN as null), not left to fail the line's write."""

from __future__ import annotations

import json

import httpx
import pytest
from django.core.files.base import ContentFile

from batches import file_check, files, tasks
from batches.files import FileRefused
from batches.models import BatchLine
from scheduling.models import Backend
from tests.integration.batches.test_create import _create, _upload, chat_line
from tests.integration.batches.test_leases import _sent
from tests.integration.billing.conftest import make_world

pytestmark = pytest.mark.django_db
MORE = '"max_tokens": 7, '
HOSTILE = {
    "nul in a message": json.dumps(chat_line("b", "a\x00b")),
    "nul in the custom_id": json.dumps(chat_line("b\x00")),
    "nul in a key": json.dumps(chat_line("b") | {"body": chat_line("b")["body"] | {"x\x00": 1}}),
    "NaN": json.dumps(chat_line("b")).replace('"max_tokens": 7', MORE + '"temperature": NaN'),
    "out of range": json.dumps(chat_line("b")).replace('"max_tokens": 7', MORE + '"temperature": 1e400'),
    "nested deep": json.dumps(chat_line("b")).replace('"max_tokens": 7', MORE + '"x": ' + "[" * 500 + "]" * 500),
}


@pytest.fixture
def world():
    return make_world()


def _hostile_upload(world, raw_line: str, *, checked: bool = True):
    """A file whose second line is ``raw_line``, written to the storage as given (not re-encoded)."""
    raw = (json.dumps(chat_line("a")) + "\n" + raw_line + "\n" + json.dumps(chat_line("c")) + "\n").encode()
    stored = files.file_store(tenant_slug="alpha", purpose="batch", upload=ContentFile(raw, name="job.jsonl"))
    found = files.file_record(stored=stored, tenant_id=world["alpha"].pk, key_prefix="k", purpose="batch")
    return file_check.file_lines_check(file_id=found.id) if checked else found


@pytest.mark.parametrize("raw_line", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_line_postgres_cannot_store_is_refused_at_upload_naming_it(world, raw_line):
    found = _hostile_upload(world, raw_line)
    assert found.check_error_line == 2 and found.check_error.startswith("Line 2: ")
    assert found.checked_lines.count() == 1  # the good line before it
    for _ in range(2):
        with pytest.raises(FileRefused) as refused:
            _create(world, found)
        assert refused.value.status == 400 and "Line 2: " in refused.value.message
    assert _create(world, _upload(world, [chat_line("x"), chat_line("y")])).lines.count() == 2  # others run


def test_a_file_left_unchecked_at_upload_is_refused_at_create_naming_the_line(world):
    found = _hostile_upload(world, HOSTILE["nul in a message"], checked=False)
    with pytest.raises(FileRefused) as refused:
        _create(world, found)
    assert refused.value.status == 400 and "Line 2: " in refused.value.message


def test_a_backend_answer_with_nul_and_nan_is_stored_and_the_line_ends(world, monkeypatch):
    raw = (
        b'{"choices":[{"message":{"content":"a\\u0000b \\\\u0000"}}],"score":NaN,"big":1e999,'
        b'"usage":{"prompt_tokens":3,"completion_tokens":2}}'
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=raw, headers={"Content-Type": "application/json"})

    real_client = httpx.Client
    monkeypatch.setattr(tasks, "upstream", tasks._Upstream())
    monkeypatch.setattr(tasks.httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(answer), **kw))
    Backend.objects.filter(name="gpu-b").update(url="http://gpu-b.invalid/v1")
    (line,) = _sent(world)
    tasks.run_line(line.pk, 1)
    ended = BatchLine.objects.get(pk=line.pk)
    assert ended.state == BatchLine.State.COMPLETED and ended.completion_tokens == 2
    assert ended.response["choices"][0]["message"]["content"] == "a\ufffdb \\u0000"  # an escaped backslash is text
    assert ended.response["score"] is None and ended.response["big"] is None
