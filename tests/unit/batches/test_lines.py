"""Batch input files are accepted whole or refused at their first bad line (batches.lines)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batches.lines import LineRefused, lines_parse

SERVED = {"chat-m": False, "embed-m": True}
CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", url: str = CHAT, **fields) -> bytes:
    body = {"model": "chat-m", "messages": [{"role": "user", "content": "hi"}]} if url == CHAT else {}
    body.update(fields)
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def parse(*raw: bytes, endpoint: str = CHAT, chunk: int | None = None):
    data = b"\n".join(raw) + b"\n"
    chunks = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return lines_parse(chunks, endpoint=endpoint, served=SERVED)


def test_good_lines_are_parsed_in_order_with_their_output_limit(settings):
    settings.FAIRGATE_DEFAULT_MAX_TOKENS = 77
    parsed = parse(line("a"), b"", line("b", max_tokens=5), chunk=7)  # split mid-line; a blank line skipped
    assert [(p.number, p.custom_id) for p in parsed] == [(1, "a"), (3, "b")]
    assert [p.payload.output_limit for p in parsed] == [77, 5]
    embeds = parse(line("e", "/v1/embeddings", model="embed-m", input=["x", "y"]), endpoint="/v1/embeddings")
    assert embeds[0].payload.output_limit == 0


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": {}, "extra": 1}).encode(), "extra"),
        (json.dumps({"method": "POST", "url": CHAT, "body": {}}).encode(), "custom_id"),
        (json.dumps({"custom_id": "x", "method": "GET", "url": CHAT, "body": {}}).encode(), "'method'"),
        (line("x", "/v1/completions"), "the batch's endpoint"),
        (json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": "hi"}).encode(), "'body'"),
        (line("x", model="chat-m", messages=[]), "'messages'"),
        (line("x", model="chat-m", messages=[{"role": "user"}], max_tokens=10**9), "at most"),
        (line("x", model="chat-m", messages=[{"role": "user"}], stream=True), "not streamed"),
        (line("x", model="nope", messages=[{"role": "user"}]), "unknown model 'nope'"),
        (line("x", model="embed-m", messages=[{"role": "user"}]), "makes embeddings"),
        (line("a"), "also line 1's"),
    ],
)
def test_the_first_bad_line_refuses_the_file_and_is_named(bad, fragment):
    with pytest.raises(LineRefused) as refused:
        parse(line("a"), bad, line("z"))
    assert refused.value.line == 2
    assert refused.value.message.startswith("Line 2: ") and fragment in refused.value.message


def test_an_empty_file_and_one_over_the_line_limit_are_refused(settings):
    with pytest.raises(LineRefused, match="no requests"):
        lines_parse([b"\n\n"], endpoint=CHAT, served=SERVED)
    settings.FAIRGATE_BATCH_MAX_LINES = 2
    with pytest.raises(LineRefused) as refused:
        parse(line("a"), line("b"), line("c"))
    assert refused.value.line == 3


@given(
    ids=st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8),
        min_size=1,
        max_size=12,
    ),
    chunk=st.integers(1, 64),
)
def test_any_file_is_accepted_whole_exactly_when_its_ids_are_unique(ids, chunk):
    raw = [line(i) for i in ids]
    if len(set(ids)) == len(ids):
        assert [p.custom_id for p in parse(*raw, chunk=chunk)] == ids
    else:
        first_repeat = next(n for n, i in enumerate(ids) if i in ids[:n])
        with pytest.raises(LineRefused) as refused:
            parse(*raw, chunk=chunk)
        assert refused.value.line == first_repeat + 1
