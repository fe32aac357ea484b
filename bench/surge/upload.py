"""The finance batch as the Batch API takes it: one JSONL file uploaded through the Files API and
started with ``POST /v1/batches`` (the official ``openai`` SDK), instead of thousands of held-open
HTTP requests. The gateway then feeds the lines into its engine itself (batches.feeder) and a
Celery worker runs each granted line (batches.tasks); the replay only polls the batch, once a
timeline step (a poll reads the counts of all its lines in the gateway's database, off its loop).

The lines' bodies are the HTTP replay's (``traffic.batch_bodies``), so both runs ask the same work.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import openai

from bench.surge.plan import Prompts, SurgePlan
from bench.surge.traffic import Clock, batch_bodies

ENDPOINT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")
CALL_TIMEOUT_S = 600.0  # an upload of ~100 MB, whose lines the gateway checks before it answers


def batch_jsonl(plan: SurgePlan, prompts: Prompts | None = None) -> bytes:
    """The batch input file: one line per batch request (``custom_id`` ``finance-1`` ...)."""
    prompts = prompts or Prompts(plan.seed)
    lines = (
        {"custom_id": f"finance-{number}", "method": "POST", "url": ENDPOINT, "body": body}
        for number, body in enumerate(batch_bodies(plan, prompts), start=1)
    )
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


@dataclass(frozen=True)
class BatchCounts:
    """The batch as ``client.batches.retrieve`` shows it."""

    status: str
    total: int
    completed: int
    failed: int

    @property
    def ended(self) -> bool:
        return self.status in ENDED


def failure_codes(error_file: bytes) -> dict[str, int]:
    """Failed lines by error code, from an error file (OpenAI's lines: ``error.code``, else the
    response's status)."""
    codes: dict[str, int] = {}
    for raw in error_file.splitlines():
        if not raw.strip():
            continue
        record = json.loads(raw)
        error = record.get("error") or {}
        response = record.get("response") or {}
        code = str(error.get("code") or response.get("status_code") or "unknown")
        codes[code] = codes.get(code, 0) + 1
    return codes


def _counts(batch) -> BatchCounts:
    counts = batch.request_counts
    return BatchCounts(
        status=batch.status,
        total=counts.total if counts else 0,
        completed=counts.completed if counts else 0,
        failed=counts.failed if counts else 0,
    )


class UploadedBatch:
    """One upload and create of the finance batch at 09:00, then its progress from the gateway."""

    def __init__(self, plan: SurgePlan, base_url: str, key: str, clock: Clock, content: bytes) -> None:
        self.plan = plan
        self.clock = clock
        self.content = content  # made before the replay's clock started: no work on its loop
        self.client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=CALL_TIMEOUT_S)
        self.batch_id: str | None = None
        self.counts: BatchCounts | None = None
        # Since the replay started, as the first poll (a step) that saw it: every line ended (the
        # drain), and the batch ended (its status; its output file is written by then).
        self.drained_sim_s: float | None = None
        self.ended_sim_s: float | None = None
        self.refused = ""  # the upload or the create failed: why
        self.upload_real_s: float | None = None
        self.create_real_s: float | None = None
        self.forecast: dict | None = None
        self.failures: dict[str, int] = {}
        self.poll_s: list[float] = []  # how long each poll's GET /v1/batches/{id} took (real s)
        self.polls_late = 0  # polls that failed or did not answer in time

    @property
    def over(self) -> bool:
        """Nothing more will happen: the batch ended, or it was never created."""
        return self.ended_sim_s is not None or bool(self.refused)

    async def submit(self) -> None:
        """Upload the file and create the batch (09:00); a refusal is kept in ``refused``."""
        try:
            started_s = time.monotonic()
            uploaded = await self.client.files.create(file=("finance.jsonl", self.content), purpose="batch")
            self.upload_real_s = time.monotonic() - started_s
            started_s = time.monotonic()
            batch = await self.client.batches.create(
                input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h"
            )
            self.create_real_s = time.monotonic() - started_s
        except openai.OpenAIError as failed:
            self.refused = f"{type(failed).__name__}: {str(failed)[:300]}"
            return
        self.batch_id = batch.id
        self.forecast = (batch.model_extra or {}).get("forecast")
        self._seen(batch)

    async def finish(self) -> None:
        """After the replay: the batch's counts then (the last poll's may be a step old, or older
        when polls went unanswered), and if it ended, its failed lines by code from its error file."""
        if self.batch_id is None:
            return
        try:
            final = await self.client.batches.retrieve(self.batch_id)
            self.counts = _counts(final)
            if self.ended_sim_s is not None and final.error_file_id is not None:
                self.failures = failure_codes((await self.client.files.content(final.error_file_id)).content)
        except openai.OpenAIError as failed:
            if self.ended_sim_s is not None and self.counts is not None:
                self.failures = {f"error file not read ({type(failed).__name__})": self.counts.failed}

    async def poll(self, timeout_s: float) -> BatchCounts | None:
        """The batch's counts now, or the last ones seen if the gateway did not answer within
        ``timeout_s`` (the poll is then counted late, and its time as ``timeout_s``)."""
        if self.batch_id is not None and self.ended_sim_s is None:
            started_s = time.monotonic()
            try:
                self._seen(await asyncio.wait_for(self.client.batches.retrieve(self.batch_id), timeout_s))
            except (openai.OpenAIError, TimeoutError):
                self.polls_late += 1
            self.poll_s.append(min(time.monotonic() - started_s, timeout_s))
        return self.counts

    def _seen(self, batch) -> None:
        self.counts = _counts(batch)
        now_sim_s = self.clock.now_sim_s()
        if self.counts.completed + self.counts.failed >= self.counts.total and self.drained_sim_s is None:
            self.drained_sim_s = now_sim_s
        if self.counts.ended and self.ended_sim_s is None:
            self.ended_sim_s = now_sim_s

    async def close(self) -> None:
        await self.client.close()
