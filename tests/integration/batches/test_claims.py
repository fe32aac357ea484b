"""Batch lines in the database: claimed in turn from every open batch and never twice, back to
the batch when their process is gone, and a batch finalized once no line is left to run."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import finalize, leases, service
from batches.models import Batch, BatchLine, LineBody
from billing.models import GatewayProcess
from tenants.models import Tenant

pytestmark = pytest.mark.django_db
State = BatchLine.State
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _batch(tenant: Tenant, lines: int, *, created_offset_s: int = 0) -> Batch:
    now = timezone.now()
    batch = Batch.objects.create(
        id=service.batch_id_new(),
        tenant=tenant,
        key_prefix="k",
        endpoint="/v1/chat/completions",
        priority_class="BATCH",
        created_at=now + timedelta(seconds=created_offset_s),
        expires_at=now + timedelta(hours=24),
    )
    made = BatchLine.objects.bulk_create(
        BatchLine(batch=batch, number=n, custom_id=f"c{n}") for n in range(1, lines + 1)
    )
    LineBody.objects.bulk_create(LineBody(line_id=line.pk, body=BODY) for line in made)
    return batch


@pytest.fixture
def tenants():
    return [Tenant.objects.create(slug=s, name=s, quota_share=0.3) for s in ("big", "small")]


def test_lines_are_claimed_in_turn_from_every_open_batch_and_never_twice(tenants):
    big, small = _batch(tenants[0], 50), _batch(tenants[1], 3)
    first = service.lines_claim(owner="a", room=6)
    assert sorted((line.batch_id, line.number) for line in first) == sorted(
        [(big.id, n) for n in (1, 2, 3)] + [(small.id, n) for n in (1, 2, 3)]
    )  # the small department's batch is not buried under the big one's
    second = service.lines_claim(owner="b", room=6)
    assert {line.pk for line in first}.isdisjoint(line.pk for line in second)
    assert [line.number for line in second] == [4, 5, 6, 7, 8, 9] and {line.batch_id for line in second} == {big.id}
    assert all(line.feeds == 1 for line in (*first, *second))


def test_a_line_sent_of_a_cancelled_batch_is_refused_and_pending_ones_end(tenants):
    batch = _batch(tenants[0], 4)
    claimed = service.lines_claim(owner="a", room=2)
    service.batch_cancel(tenant_id=tenants[0].pk, batch_id=batch.id)
    assert not leases.line_sent(claimed[0].pk, "b", "key")  # a cancelled batch grants no more
    assert set(batch.lines.filter(state=State.CANCELLED).values_list("number", flat=True)) == {3, 4}
    for line in claimed:
        service.line_end(line.pk, State.CANCELLED, service.CANCELLED_ERROR)
    assert finalize.batches_finalize() == 1
    batch.refresh_from_db()
    assert batch.status == Batch.Status.CANCELLED and batch.output_file is None and batch.error_file is not None
    assert batch.error_file.lines == 4


def test_lines_of_a_gone_process_go_back_once_billing_released_its_holds(tenants):
    batch = _batch(tenants[0], 3)
    service.lines_claim(owner="dead", room=2)
    now = timezone.now()
    gone = GatewayProcess.objects.create(owner="dead", host="h", pid=1, started_at=now, beat_at=now)
    assert service.requeue_lines_of_gone_processes() == 0  # holds not released yet: still its
    gone.released_at = now
    gone.save()
    assert service.requeue_lines_of_gone_processes() == 2
    again = service.lines_claim(owner="alive", room=3)
    assert sorted(line.number for line in again) == [1, 2, 3]
    assert {line.number: service.public_id_of(line) for line in again} == {
        1: f"{batch.id}.1~2",
        2: f"{batch.id}.2~2",
        3: f"{batch.id}.3",
    }  # fed again under new ids: the old ones may still be live in a shared engine


def test_beat_expires_the_pending_lines_of_a_batch_past_its_window_and_it_ends_expired(tenants):
    batch = _batch(tenants[0], 4)
    claimed = service.lines_claim(owner="a", room=1)  # one waits in an engine
    assert service.batches_expire() == 0  # its window is open
    Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert service.batches_cancelled([claimed[0].pk]) == {claimed[0].pk}  # the feeder takes it out of its engine
    service.line_drop(claimed[0].pk)  # ... and it goes back to pending (its batch still runs)
    assert service.batches_expire() == 4
    assert finalize.batches_finalize() == 1
    batch.refresh_from_db()
    assert batch.status == Batch.Status.EXPIRED and batch.expired_at is not None and batch.output_file is None
    assert batch.error_file.lines == 4
    assert set(batch.lines.values_list("error__code", flat=True)) == {"batch_expired"}


def test_the_tally_counts_batches_by_status_and_lines_by_state(tenants):
    done, running = _batch(tenants[0], 2), _batch(tenants[1], 3)
    Batch.objects.filter(pk=done.pk).update(status=Batch.Status.COMPLETED)
    done.lines.update(state=State.COMPLETED)
    service.lines_claim(owner="a", room=1)
    assert service.batches_tally() == {
        "batches": {"completed": 1, "in_progress": 1},
        "lines": {"completed": 2, "claimed": 1, "pending": 2},
    }
    assert running.lines.filter(state=State.CLAIMED).count() == 1


def test_claims_are_shared_by_tenant_not_by_batch_and_every_tenant_comes_in_turn(tenants):
    many = [_batch(tenants[0], 5) for _ in range(3)]  # one department's three batches
    one = _batch(tenants[1], 5)
    claimed = service.lines_claim(owner="a", room=4)
    by_tenant = Counter(line.batch.tenant_id for line in claimed)
    assert by_tenant == {tenants[0].pk: 2, tenants[1].pk: 2}  # not 3 : 1
    assert {line.batch_id for line in claimed} == {many[0].id, many[1].id, one.id}
    third = Tenant.objects.create(slug="third", name="third", quota_share=0.1)
    late = _batch(third, 5)
    first = service.lines_claim(owner="a", room=2)  # more tenants than room: the first two by batch id
    assert late.id not in {line.batch_id for line in first}
    after = max(line.batch_id for line in first)
    turn = service.lines_claim(owner="a", room=2, after=after)
    assert late.id in {line.batch_id for line in turn}  # the next claim starts after them


def test_a_batch_is_ready_to_finalize_only_once_no_line_is_left_and_its_task_finalizes_it_once(tenants):
    """Serving processes only ask which batches are ready (`batches_ready`) and hand each to a
    worker (`batches.finalize`): building the files of a large batch is seconds of CPU that in the
    serving process would hold the GIL against the event loop (a stall at the end of make surge)."""
    from batches import tasks

    batch = _batch(tenants[0], 3)
    claimed = service.lines_claim(owner="a", room=3)
    service.line_end(claimed[0].pk, State.COMPLETED, None)
    assert batch.id not in service.batches_ready()  # two lines still claimed
    assert tasks.finalize(batch.id) is False
    for line in claimed[1:]:
        service.line_end(line.pk, State.FAILED, {"code": "upstream_error", "message": "x"})
    assert service.batches_ready() == [batch.id]
    assert tasks.finalize(batch.id) is True
    batch.refresh_from_db()
    assert batch.status == Batch.Status.COMPLETED and batch.output_file.lines == 1 and batch.error_file.lines == 2
    assert tasks.finalize(batch.id) is False  # a second copy of the task does nothing
    assert service.batches_ready() == []
