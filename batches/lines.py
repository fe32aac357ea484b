"""A batch input file, line by line, checked as the gateway would check each request on its face.

Each line is one JSON object (``custom_id``, ``method``, ``url``, ``body``). The first line that
does not check (malformed or unstorable JSON, a missing or repeated ``custom_id``, another
endpoint, a body the gateway would refuse, a model not served, too many lines) refuses the whole
file, naming the line. Blank lines are skipped; what only a run can know is not checked here.
Pure: no database, no storage; the caller passes the file's bytes and the models served.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from django.conf import settings

from batches.client_json import JsonRefused, json_checked
from gateway.api import (
    CHAT,
    EMBED,
    TEXT,
    GatewayError,
    Payload,
    output_limit,
    output_tokens_held,
    payload_parse,
    prompt_bound,
)

ENDPOINTS = {"/v1/chat/completions": CHAT, "/v1/completions": TEXT, "/v1/embeddings": EMBED}
URLS = {kind: url for url, kind in ENDPOINTS.items()}
MAX_CUSTOM_ID = 128
LINE_KEYS = {"custom_id", "method", "url", "body"}


class LineRefused(Exception):
    """The file is refused at ``line`` (1-based): ``message`` names it and says why."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.message = f"Line {line}: {reason}"
        super().__init__(self.message)


@dataclass(frozen=True)
class Line:
    number: int
    custom_id: str
    payload: Payload  # parsed and limited (``output_limit`` set); its token estimate is made when it runs

    @property
    def terms(self) -> Terms:
        return Terms(self.number, self.payload.model, prompt_bound(self.payload), output_tokens_held(self.payload))


@dataclass(frozen=True)
class Terms:
    """What a line's hold and its share of the work depend on (batches.forecast)."""

    number: int
    model: str
    prompt_bound: int
    output_tokens: int  # held: the output limit times the line's choices


def _split(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line of the file given in chunks."""
    number, rest = 0, b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        for raw in whole:
            number += 1
            yield number, raw
    if rest:
        yield number + 1, rest


def model_error(model: str, kind: str, served: Mapping[str, bool]) -> str | None:
    embeds = served.get(model)
    if embeds is None:
        return f"unknown model '{model[:64]}' (models served here: {', '.join(sorted(served)) or 'none'})"
    if (kind == EMBED) != embeds:
        return f"model '{model}' " + ("makes embeddings: use /v1/embeddings" if embeds else "does not make embeddings")
    return None


def _record(number: int, raw: bytes) -> dict:
    try:
        record = json_checked(raw)
    except JsonRefused as refused:
        raise LineRefused(number, refused.reason) from None
    if not isinstance(record, dict):
        raise LineRefused(number, "must be a JSON object with custom_id, method, url and body.")
    unknown = set(record) - LINE_KEYS
    if unknown:
        raise LineRefused(number, f"unknown field(s) {', '.join(sorted(unknown))[:200]}.")
    return record


def _url_error(url: object, endpoint: str | None) -> str | None:
    if endpoint is not None and url != endpoint:
        return f"'url' must be the batch's endpoint {endpoint}, not {str(url)[:64]!r}."
    if endpoint is None and url not in ENDPOINTS:
        return f"'url' must be one of {', '.join(ENDPOINTS)}, not {str(url)[:64]!r}."
    return None


def _line(number: int, raw: bytes, endpoint: str | None, served: Mapping[str, bool] | None) -> tuple[str, Payload]:
    record = _record(number, raw)
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
        raise LineRefused(number, f"'custom_id' must be a string of 1 to {MAX_CUSTOM_ID} characters.")
    if record.get("method") != "POST":
        raise LineRefused(number, "'method' must be POST.")
    url_error = _url_error(record.get("url"), endpoint)
    if url_error is not None:
        raise LineRefused(number, url_error)
    body = record.get("body")
    if not isinstance(body, dict):
        raise LineRefused(number, "'body' must be a JSON object: the request as the endpoint takes it.")
    kind = ENDPOINTS[record["url"]]
    try:
        payload = payload_parse(kind, json.dumps(body, separators=(",", ":")).encode())
        if payload.stream:
            raise LineRefused(number, "a batch line is not streamed: leave 'stream' out.")
        payload.output_limit = output_limit(payload)
    except GatewayError as refused:
        raise LineRefused(number, refused.message) from None
    problem = None if served is None else model_error(payload.model, kind, served)
    if problem is not None:
        raise LineRefused(number, problem + ".")
    return custom_id, payload


def lines_read(chunks: Iterable[bytes], *, endpoint: str | None, served: Mapping[str, bool] | None) -> Iterator[Line]:
    """Each line of the file, checked, in order; raises LineRefused at the first bad one (the lines
    before it were yielded). ``served`` maps each configured model to whether it embeds (None:
    models are not checked here, as at upload, when the batch's backends are not known yet).
    ``endpoint`` None: every line must name the first line's url (one of ENDPOINTS), as at
    upload, before the batch names its endpoint."""
    if endpoint is not None and endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}")
    count = 0
    seen: dict[str, int] = {}
    for number, raw in _split(chunks):
        if not raw.strip():
            continue
        if count == settings.FAIRGATE_BATCH_MAX_LINES:
            raise LineRefused(number, f"a batch has at most {settings.FAIRGATE_BATCH_MAX_LINES} lines here.")
        custom_id, payload = _line(number, raw, endpoint, served)
        endpoint = endpoint or URLS[payload.kind]  # the first line's url: every line's
        if custom_id in seen:
            raise LineRefused(number, f"custom_id '{custom_id}' is also line {seen[custom_id]}'s.")
        seen[custom_id] = number
        count += 1
        yield Line(number, custom_id, payload)
    if not count:
        raise LineRefused(1, "the file has no requests.")


def lines_parse(chunks: Iterable[bytes], *, endpoint: str | None, served: Mapping[str, bool] | None) -> list[Line]:
    """Every line of the file, checked (`lines_read`): all of them, or LineRefused at the first bad one."""
    return list(lines_read(chunks, endpoint=endpoint, served=served))


def line_payload(line) -> Payload:
    """A batch line (a BatchLine with its batch and ``content``) as the gateway's request: its output
    limit, prompt bound and estimate as its upload's check stored them (a line made without them:
    the limit and bound worked out here, the estimate left 0 for the caller to make)."""
    raw = json.dumps(line.content.body, separators=(",", ":")).encode()
    payload = payload_parse(ENDPOINTS[line.batch.endpoint], raw)
    payload.output_limit = output_limit(payload) if line.output_limit is None else line.output_limit
    payload.prompt_bound = prompt_bound(payload) if line.bound_tokens is None else line.bound_tokens
    payload.prompt_tokens = line.estimated_tokens or 0
    return payload
