"""The Batch API end to end with the official openai SDK: upload, create, poll, download. The
gateway feeds the lines to its engine, a real Celery worker process runs each granted line, and
every line is charged once; a malformed file is refused whole, naming its line; a cancelled batch
stops granting, lets its running lines finish and ends with their output."""

from __future__ import annotations

import io
import json

import httpx
import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import (
    another_process,
    celery_broker,
    start_celery,
    start_gateway,
    stop_process,
    wait_for,
    wait_until,
)
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

FIN_KEY = {"fin": ("fin", "BATCH")}
KEYS = {**FIN_KEY, "thin": ("thin", "BATCH"), "poor": ("poor", "BATCH")}
SLOTS = 2
CHARGES = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id__startswith={prefix!r}, kind="charge")
print(json.dumps(sorted(rows.values_list("request_id", flat=True))))
"""
FINANCE_REPORT = """
import json
from billing.reports import charges_by_month
from tenants.models import Tenant
rows = charges_by_month(tenants=Tenant.objects.filter(slug="fin"))
print(json.dumps({"fin": {r["class"]: r["requests"] for r in rows}}))
"""
STATES = """
from batches.models import BatchLine
print(list(BatchLine.objects.filter(batch_id={batch_id!r}).values_list("number", "state", "owner", "error")))
"""
SPENDERS = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id__startswith={prefix!r})
print(json.dumps(sorted(set(rows.values_list("kind", "key_prefix", "job_id", "key_creator")))))
"""
HOLDS_OPEN = """
from billing.models import LedgerEntry
entries = LedgerEntry.objects.filter(request_id__startswith={prefix!r})
held = set(entries.filter(kind="hold").values_list("request_id", flat=True))
ended = set(entries.filter(kind__in=("charge", "release")).values_list("request_id", flat=True))
print(len(held - ended))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=SLOTS, ttft_ms=2, tokens_per_s=5000, seed=9))
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH", "RETRY"],
        tenants=[tenant("fin", share=0.5), tenant("thin", budget=1), tenant("poor", budget=0.01)],
        backends=[backend("b", f"{sim.url}/v1", models=("m", "e"), slots=SLOTS) | {"embedding_models": ["e"]}],
        # one attempt per line: the depth rule's floor admits them all; predicted admission, on the
        # 20 s prior before any completion, has room for fewer and the feeder retries the rest
        queue={"admission": "depth"},
    )
    settings = {"FAIRGATE_BATCH_SWEEP_S": "1", **celery_broker()}  # beat's batches.sweep (expiry) each second
    var_dir = tmp_path_factory.mktemp("gw-batches")
    gateway = start_gateway(var_dir, yaml, KEYS, **settings)
    worker = start_celery(gateway.env, var_dir / "worker.log")
    beat = start_celery(gateway.env, var_dir / "beat.log", beat=True)
    yield gateway, sim
    for process in (beat, worker):
        stop_process(process)
    gateway.stop()
    sim.stop()


def jsonl(lines: list[dict]) -> io.BytesIO:
    return io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def chat_line(custom_id: str, text: str = "hello") -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 5}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def upload(sdk: openai.OpenAI, lines: list[dict]) -> str:
    return sdk.files.create(file=("job.jsonl", jsonl(lines)), purpose="batch").id


def ended(sdk: openai.OpenAI, batch_id: str, status: str = "completed", gateway=None):
    try:
        return wait_for(
            lambda: sdk.batches.retrieve(batch_id),
            lambda batch: batch.status == status,
            what=f"batch {batch_id} {status}",
            limit_s=90,
            step_s=0.25,
        )
    except AssertionError:
        if gateway is not None:
            print(gateway.shell(STATES.format(batch_id=batch_id)))
            print(gateway.log()[-3000:])
        raise


def batch_holding_the_slots(sdk: openai.OpenAI, sim, lines: list[dict], what: str):
    """A batch of ``lines`` created while the backend's gate is closed, once its lines hold every slot."""
    batch = sdk.batches.create(
        input_file_id=upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(lambda: httpx.get(f"{sim.url}/gate").json()["waiting"] == SLOTS, limit_s=60, what=what)
    return batch


def holds_released(gateway, batch_id: str, what: str) -> None:
    wait_until(
        lambda: gateway.shell(HOLDS_OPEN.format(prefix=f"fin/{batch_id}.")).strip() == "0",
        limit_s=30,
        step_s=0.5,
        what=what,
    )


def output_of(sdk: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in sdk.files.content(file_id).read().splitlines()]


def test_a_batch_runs_every_line_once_and_charges_each_once(stack):
    gateway, _ = stack
    sdk = gateway.sdk("fin")
    lines = [chat_line(f"q{i}", f"question {i}") for i in range(7)]
    batch = sdk.batches.create(
        input_file_id=upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 7
    done = ended(sdk, batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (7, 0)
    assert done.error_file_id is None
    out = output_of(sdk, done.output_file_id)
    assert sorted(line["custom_id"] for line in out) == [f"q{i}" for i in range(7)]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in out)
    assert all(line["response"]["body"]["choices"][0]["message"]["content"] for line in out)
    charged = json.loads(gateway.shell(CHARGES.format(prefix=f"fin/{batch.id}.")).strip())
    assert charged == sorted(f"fin/{batch.id}.{n}" for n in range(1, 8))  # one charge per line, its line number
    assert gateway.shell(HOLDS_OPEN.format(prefix=f"fin/{batch.id}.")).strip() == "0"
    spenders = json.loads(gateway.shell(SPENDERS.format(prefix=f"fin/{batch.id}.")).strip())
    fin_prefix = gateway.keys["fin"].split("_")[1]  # each line's entries: the batch's key, the batch as job
    assert spenders == [[kind, fin_prefix, batch.id, "setup"] for kind in ("charge", "hold", "release")]
    assert any(b.id == batch.id for b in sdk.batches.list())
    report = json.loads(gateway.shell(FINANCE_REPORT).strip())  # finance's report, as for any request
    assert report["fin"]["BATCH"] >= 7


def _metric(gateway, name: str, label: str) -> float:
    for line in httpx.get(f"{gateway.url}/metrics").text.splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


def test_metrics_count_batches_by_status_and_lines_by_state(stack):
    gateway, _ = stack
    sdk = gateway.sdk("fin")
    batch = sdk.batches.create(
        input_file_id=upload(sdk, [chat_line(f"m{i}") for i in range(3)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    ended(sdk, batch.id)
    completed = sum(b.status == "completed" for b in sdk.batches.list())
    lines_done = sum(b.request_counts.completed for b in sdk.batches.list() if b.status == "completed")
    wait_until(
        lambda: (
            _metric(gateway, "fairgate_batches", 'status="completed"') >= completed
            and _metric(gateway, "fairgate_batch_lines", 'state="completed"') >= lines_done
        ),
        limit_s=30,
        step_s=0.5,
        what="the finished batch and its lines counted in /metrics",
    )
    assert _metric(gateway, "fairgate_batch_lines", 'state="pending"') == 0  # every state is shown
    assert "fairgate_batch_lines_resent_total 0.0" in httpx.get(f"{gateway.url}/metrics").text


def test_an_embeddings_batch_runs_on_its_endpoint(stack):
    gateway, _ = stack
    sdk = gateway.sdk("fin")
    lines = [
        {"custom_id": f"d{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "e", "input": f"doc {i}"}}
        for i in range(3)
    ]
    batch = sdk.batches.create(input_file_id=upload(sdk, lines), endpoint="/v1/embeddings", completion_window="24h")
    out = output_of(sdk, ended(sdk, batch.id).output_file_id)
    assert sorted(line["custom_id"] for line in out) == ["d0", "d1", "d2"]
    assert all(line["response"]["body"]["data"][0]["object"] == "embedding" for line in out)


CHECKED = """
import json
from batches.models import BatchFile
found = BatchFile.objects.get(pk={file_id!r})
rows = found.checked_lines.order_by("number").values_list("number", "custom_id", "estimated_tokens", "output_limit")
print(json.dumps([found.checked_at is not None, found.check_error, [list(row) for row in rows]]))
"""


def test_an_uploaded_file_is_checked_at_upload_and_the_create_only_reads_the_result(stack):
    gateway, _ = stack
    sdk = gateway.sdk("fin")
    good = upload(sdk, [chat_line("a", "one two three"), chat_line("b")])
    checked, error, rows = json.loads(gateway.shell(CHECKED.format(file_id=good)).strip())
    assert (checked, error) == (True, "")  # by the checking process, before the upload was answered
    assert [(n, c, limit) for n, c, _, limit in rows] == [(1, "a", 5), (2, "b", 5)]
    assert all(tokens > 0 for _, _, tokens, _ in rows)  # each line's estimate, stored
    bad = upload(sdk, [chat_line("a"), {**chat_line("b"), "method": "GET"}])  # stored: a file is not a batch yet
    checked, error, rows = json.loads(gateway.shell(CHECKED.format(file_id=bad)).strip())
    assert (checked, error, [row[0] for row in rows]) == (True, "Line 2: 'method' must be POST.", [1])
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.batches.create(input_file_id=bad, endpoint="/v1/chat/completions", completion_window="24h")
    assert "Line 2: 'method' must be POST." in refused.value.message
    batch = sdk.batches.create(input_file_id=good, endpoint="/v1/chat/completions", completion_window="24h")
    assert ended(sdk, batch.id, gateway=gateway).request_counts.completed == 2
    assert "Traceback" not in gateway.log()


def test_a_malformed_file_is_refused_whole_naming_its_first_bad_line(stack):
    gateway, _ = stack
    sdk = gateway.sdk("fin")
    before = {b.id for b in sdk.batches.list()}
    for lines, fragment in (
        ([chat_line("a"), chat_line("a")], "Line 2: custom_id 'a' is also line 1's"),
        ([chat_line("a"), {**chat_line("b"), "body": {"model": "nope", "messages": []}}], "Line 2:"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.batches.create(
                input_file_id=upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert fragment in refused.value.message
    with pytest.raises(openai.BadRequestError):
        sdk.batches.create(
            input_file_id=upload(sdk, [chat_line("a")]), endpoint="/v1/embeddings", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        sdk.batches.create(
            input_file_id=upload(sdk, [chat_line("a")]), endpoint="/v1/chat/completions", completion_window="1h"
        )
    with pytest.raises(openai.NotFoundError):
        sdk.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    assert {b.id for b in sdk.batches.list()} == before


def test_a_budget_that_cannot_hold_one_line_refuses_the_batch_and_a_line_past_the_budget_fails(stack):
    gateway, _ = stack
    poor = gateway.sdk("poor")
    with pytest.raises(openai.APIStatusError) as refused:
        poor.batches.create(
            input_file_id=upload(poor, [chat_line("p0")]), endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert refused.value.status_code == 402 and "no line could run" in refused.value.message
    assert list(poor.batches.list()) == []
    thin = gateway.sdk("thin")  # a budget of 1: a line of 1000 output tokens holds 1.4 (0.7 x 2 per 1k)
    dear = {**chat_line("dear"), "body": {**chat_line("dear")["body"], "max_tokens": 1000}}
    batch = thin.batches.create(
        input_file_id=upload(thin, [chat_line("t0"), dear, chat_line("t1")]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    said = batch.model_extra["forecast"]
    assert said["budget_covers"] is False and float(said["cost_bound"]) > 1 and said["fits_window"] is True
    done = ended(thin, batch.id, gateway=gateway)
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    assert sorted(line["custom_id"] for line in output_of(thin, done.output_file_id)) == ["t0", "t1"]
    (error,) = output_of(thin, done.error_file_id)
    assert error["custom_id"] == "dear" and error["error"]["code"] == "budget_exhausted"


def test_a_cancelled_batch_lets_its_running_lines_finish_and_ends_cancelled(stack):
    gateway, sim = stack
    sdk = gateway.sdk("fin")
    httpx.post(f"{sim.url}/gate", json={"action": "close"}).raise_for_status()
    try:
        batch = batch_holding_the_slots(
            sdk, sim, [chat_line(f"c{i}") for i in range(8)], "the backend's slots taken by the batch"
        )
        assert sdk.batches.cancel(batch.id).status == "cancelling"
    finally:
        httpx.post(f"{sim.url}/gate", json={"action": "open"}).raise_for_status()
    done = ended(sdk, batch.id, "cancelled", gateway)
    assert (done.request_counts.completed, done.request_counts.failed) == (SLOTS, 8 - SLOTS)
    assert len(output_of(sdk, done.output_file_id)) == SLOTS
    errors = output_of(sdk, done.error_file_id)
    assert len(errors) == 8 - SLOTS and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    charged = json.loads(gateway.shell(CHARGES.format(prefix=f"fin/{batch.id}.")).strip())
    assert len(charged) == SLOTS
    holds_released(gateway, batch.id, "every hold of the cancelled lines released")


WINDOW_ENDS = """
from datetime import timedelta
from django.utils import timezone
from batches.models import Batch
Batch.objects.filter(id={batch_id!r}).update(expires_at=timezone.now() - timedelta(seconds=1))
"""


def test_a_batch_whose_window_ends_expires_its_waiting_lines_and_keeps_what_ran(stack):
    gateway, sim = stack
    sdk = gateway.sdk("fin")
    httpx.post(f"{sim.url}/gate", json={"action": "close"}).raise_for_status()
    try:
        batch = batch_holding_the_slots(
            sdk, sim, [chat_line(f"x{i}") for i in range(6)], "two lines running, the others waiting"
        )
        gateway.shell(WINDOW_ENDS.format(batch_id=batch.id))  # as if 24 h had passed
        wait_until(
            lambda: sdk.batches.retrieve(batch.id).request_counts.failed == 6 - SLOTS,
            limit_s=60,
            step_s=0.25,
            what="the waiting lines expired (by beat)",
        )
    finally:
        httpx.post(f"{sim.url}/gate", json={"action": "open"}).raise_for_status()
    done = ended(sdk, batch.id, "expired", gateway)
    assert (done.request_counts.completed, done.request_counts.failed) == (SLOTS, 6 - SLOTS)
    assert done.expired_at is not None
    assert len(output_of(sdk, done.output_file_id)) == SLOTS  # what was running when the window ended
    errors = output_of(sdk, done.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"} and len(errors) == 6 - SLOTS
    assert len(json.loads(gateway.shell(CHARGES.format(prefix=f"fin/{batch.id}.")).strip())) == SLOTS
    holds_released(gateway, batch.id, "every hold of the expired lines released")


LINE_STATES = """
from collections import Counter
from batches.models import BatchLine
print(sorted(Counter(BatchLine.objects.filter(batch_id={batch_id!r}).values_list("state", flat=True)).items()))
"""
CHARGED_KEYS = """
import json
from billing.models import LedgerEntry
charges = LedgerEntry.objects.filter(request_id__startswith={prefix!r}, kind="charge")
print(json.dumps(list(charges.values_list("request_id", flat=True))))
"""


def test_a_gateway_killed_with_lines_in_its_engine_loses_none_and_charges_each_once(tmp_path):
    sim = start_in_thread(SimConfig(port=0, slots=SLOTS, ttft_ms=2, tokens_per_s=5000, seed=11))
    httpx.post(f"{sim.url}/gate", json={"action": "close"}).raise_for_status()
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH", "RETRY"],
        tenants=[tenant("fin", share=0.5)],
        backends=[backend("b", f"{sim.url}/v1", slots=SLOTS)],
    )
    settings = {
        **celery_broker(),
        "FAIRGATE_HEARTBEAT_S": "1",
        "FAIRGATE_PROCESS_DEAD_AFTER_S": "3",
        "FAIRGATE_ORPHAN_SWEEP_S": "1",
    }
    first = start_gateway(tmp_path / "gw", yaml, FIN_KEY, **settings)
    worker = start_celery(first.env, tmp_path / "worker.log")
    second = None
    try:
        sdk = first.sdk("fin")
        batch = sdk.batches.create(
            input_file_id=upload(sdk, [chat_line(f"k{i}") for i in range(6)]),
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        wait_until(
            lambda: first.shell(LINE_STATES.format(batch_id=batch.id)).strip() == "[('claimed', 4), ('sent', 2)]",
            limit_s=60,
            step_s=0.25,
            what="two lines running and four waiting in the first gateway's engine",
        )
        first.kill()  # SIGKILL: its engine, with four lines in it, is gone
        second = another_process(first, "the gateway started again")
        httpx.post(f"{sim.url}/gate", json={"action": "open"}).raise_for_status()
        done = ended(second.sdk("fin"), batch.id, gateway=second)
        assert (done.request_counts.completed, done.request_counts.failed) == (6, 0)
        out = output_of(second.sdk("fin"), done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == [f"k{i}" for i in range(6)]  # each once
        keys = json.loads(second.shell(CHARGED_KEYS.format(prefix=f"fin/{batch.id}.")).strip())
        lines_charged = sorted(key.split("#")[0].split("~")[0] for key in keys)  # whichever feed ran it
        assert lines_charged == sorted(f"fin/{batch.id}.{n}" for n in range(1, 7))
        holds_released(second, batch.id, "no hold left open")
    finally:
        httpx.post(f"{sim.url}/gate", json={"action": "open"})
        stop_process(worker)
        if second is not None:
            second.stop()
        first.stop()
        sim.stop()


RUNS = """
import json
from batches.models import BatchLine
print(json.dumps(sorted(BatchLine.objects.filter(batch_id={batch_id!r}).values_list("number", "state", "runs"))))
"""


def test_a_worker_killed_mid_line_has_its_lines_run_once_more_by_another(tmp_path):
    sim = start_in_thread(SimConfig(port=0, slots=SLOTS, ttft_ms=2, tokens_per_s=5000, seed=12))
    httpx.post(f"{sim.url}/gate", json={"action": "close"}).raise_for_status()
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH", "RETRY"],
        tenants=[tenant("fin", share=0.5)],
        backends=[backend("b", f"{sim.url}/v1", slots=SLOTS)],
    )
    settings = {
        **celery_broker(),
        "FAIRGATE_BATCH_LEASE_MS": "2000",  # a dead worker's lines are noticed within 2 s
    }
    gateway = start_gateway(tmp_path / "gw", yaml, FIN_KEY, **settings)
    doomed = start_celery(gateway.env, tmp_path / "doomed.log")
    other = None
    try:
        sdk = gateway.sdk("fin")
        batch = batch_holding_the_slots(
            sdk, sim, [chat_line(f"w{i}") for i in range(4)], "the only worker running two lines, held at the backend"
        )
        other = start_celery(gateway.env, tmp_path / "other.log")
        doomed.kill()  # SIGKILL mid-line: its two calls and their results die with it
        doomed.wait(timeout=10)
        httpx.post(f"{sim.url}/gate", json={"action": "open"}).raise_for_status()
        done = ended(sdk, batch.id, gateway=gateway)
        assert (done.request_counts.completed, done.request_counts.failed) == (4, 0)
        out = output_of(sdk, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == [f"w{i}" for i in range(4)]  # each once
        runs = json.loads(gateway.shell(RUNS.format(batch_id=batch.id)).strip())  # [[number, state, runs]]
        assert sorted(r for _, _, r in runs) == [1, 1, 2, 2], runs  # the killed two once more, the others once
        charged = json.loads(gateway.shell(CHARGES.format(prefix=f"fin/{batch.id}.")).strip())
        assert charged == sorted(f"fin/{batch.id}.{n}" for n in range(1, 5))  # each charged once
        assert gateway.shell(HOLDS_OPEN.format(prefix=f"fin/{batch.id}.")).strip() == "0"
    finally:
        httpx.post(f"{sim.url}/gate", json={"action": "open"})
        for worker in (doomed, other):
            stop_process(worker)
        gateway.stop()
        sim.stop()
