"""A batch's output is streamed (batches.finalize): the finalizing process's peak memory does not
grow with the batch's lines, the output file holds every line in input order, the batch's row is
not locked while the files are written, and two finalizers racing leave exactly one output file."""

from __future__ import annotations

import json
import threading
import tracemalloc
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from batches import finalize, tasks
from batches.files import files_storage
from batches.models import Batch, BatchFile, BatchLine
from batches.service import FINALIZE_STALE_S
from bench.batch_finalize_memory import ended_batch
from tenants.models import Tenant

State = BatchLine.State
ANSWER_BYTES = 1024


@pytest.fixture
def storage_dir(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "batch_files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    return tmp_path


def _ended_batch(tenant: Tenant, lines: int) -> Batch:
    """A batch whose ``lines`` lines all ended (every 50th failed)."""
    return ended_batch(tenant=tenant, lines=lines, text="x" * ANSWER_BYTES, failed_every=50)


def _peak_bytes_finalizing(batch: Batch) -> int:
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        assert tasks.finalize(batch.id) is True
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def _file_lines(found: BatchFile) -> list[dict]:
    with files_storage().open(found.storage_name, "rb") as stream:
        return [json.loads(line) for line in stream]


@pytest.mark.django_db
def test_the_finalizers_peak_memory_does_not_grow_with_the_lines_and_every_line_is_written_in_order(storage_dir):
    tenant = Tenant.objects.create(slug="big", name="big", quota_share=0.5)
    small, large = _ended_batch(tenant, 2_000), _ended_batch(tenant, 20_000)
    small_peak = _peak_bytes_finalizing(small)
    large_peak = _peak_bytes_finalizing(large)
    assert large_peak < 3 * small_peak, (small_peak, large_peak)  # ten times the lines
    large.refresh_from_db()
    assert large.status == Batch.Status.COMPLETED and large.output_file.lines == 19_600
    written = _file_lines(large.output_file)
    assert [line["custom_id"] for line in written] == [f"c{n}" for n in range(1, 20_001) if n % 50]
    assert written[0]["response"]["body"]["choices"][0]["message"]["content"] == "x" * ANSWER_BYTES
    errors = _file_lines(large.error_file)
    assert [line["custom_id"] for line in errors] == [f"c{n}" for n in range(50, 20_001, 50)]


def _elsewhere(work):
    """``work()`` in another thread, on its own database connection; its result or its exception."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except Exception as failed:  # handed back to the test
            result["error"] = failed
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _lock_nowait(pk: str) -> bool:
    with transaction.atomic():
        return Batch.objects.select_for_update(nowait=True).filter(pk=pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_row_is_not_locked_while_writing_and_racing_finalizers_leave_one_output_file(storage_dir, monkeypatch):
    tenant = Tenant.objects.create(slug="race", name="race", quota_share=0.5)
    batch = _ended_batch(tenant, 30)
    seen: dict[str, object] = {}
    real_write = finalize.file_write

    def write_while_others_come(**kwargs):
        if not seen:  # the first finalizer, between its claim and its record
            seen["locked"] = not _elsewhere(lambda: _lock_nowait(batch.id))
            seen["second"] = _elsewhere(lambda: finalize.batch_finalize(batch.id))  # claimed: not stale yet
            stale = timezone.now() - timedelta(seconds=FINALIZE_STALE_S + 1)
            Batch.objects.filter(pk=batch.id).update(finalizing_at=stale)  # as if the first had stopped
            seen["takeover"] = _elsewhere(lambda: finalize.batch_finalize(batch.id))
        return real_write(**kwargs)

    monkeypatch.setattr(finalize, "file_write", write_while_others_come)
    assert finalize.batch_finalize(batch.id) is False  # its claim was taken over: what it wrote is deleted
    assert seen == {"locked": False, "second": False, "takeover": True}
    batch.refresh_from_db()
    assert batch.status == Batch.Status.COMPLETED
    outputs = BatchFile.objects.filter(tenant=tenant, purpose=BatchFile.Purpose.BATCH_OUTPUT)
    assert list(outputs.values_list("pk", flat=True)) == [batch.output_file_id] and batch.error_file_id is None
    stored = sorted(p.name for p in (storage_dir / "race").iterdir())
    assert stored == sorted(f.storage_name.split("/")[-1] for f in outputs)  # the loser's bytes are gone
    assert [line["custom_id"] for line in _file_lines(batch.output_file)] == [f"c{n}" for n in range(1, 31)]
    assert finalize.batch_finalize(batch.id) is False
