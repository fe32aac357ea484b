"""Leases on sent lines (batches.leases): each send of a line starts at most once and only while
it is the line's latest; a line whose worker died (its lease lapsed) is sent again, at most once
more after a run, then fails with its hold released; a lapsed line of a gone process goes back to
its batch."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from batches import leases, service
from batches.models import Batch, BatchLine
from billing.models import GatewayProcess, LedgerEntry
from tests.integration.batches.test_claims import _batch
from tests.integration.billing.conftest import make_world
from tests.integration.billing.helpers import hold, year_budget

pytestmark = pytest.mark.django_db
State = BatchLine.State


@pytest.fixture
def world():
    return make_world()


def _sent(world, owner: str = "me", lines: int = 1, held: bool = True) -> list[BatchLine]:
    batch = _batch(world["alpha"], lines)
    sent = []
    for line in service.lines_claim(owner=owner, room=lines):
        key = f"alpha/{batch.id}.{line.number}"
        if held:
            hold(key, cls="BATCH")
        assert leases.line_sent(line.pk, "gpu-b", key) == 1
        sent.append(BatchLine.objects.get(pk=line.pk))
    return sent


def _lapse(line: BatchLine) -> None:
    BatchLine.objects.filter(pk=line.pk).update(lease_until=timezone.now() - timedelta(seconds=1))


def test_a_send_starts_once_and_only_while_it_is_the_latest(world):
    (line,) = _sent(world)
    assert leases.line_start(line.pk, 1) and not leases.line_start(line.pk, 1)  # a redelivery of send 1
    _lapse(line)  # its worker died
    ended, again = leases.lines_watch([line.pk])
    assert (ended, again) == ({}, [(line.pk, 2)])
    assert not leases.line_start(line.pk, 1)  # the old task, delivered late: stale
    assert leases.line_start(line.pk, 2)
    line.refresh_from_db()
    assert (line.runs, line.sends, line.started_send) == (2, 2, 2) and line.lease_until > timezone.now()


def test_a_line_not_yet_started_is_sent_again_without_using_a_run(world):
    (line,) = _sent(world)
    _lapse(line)  # no worker took it up in the hand-off time (or the broker lost it)
    assert leases.lines_watch([line.pk]) == ({}, [(line.pk, 2)])
    assert leases.line_start(line.pk, 2)
    line.refresh_from_db()
    assert line.runs == 1


def test_a_line_two_workers_died_running_fails_and_its_hold_is_released(world):
    (line,) = _sent(world)
    held = year_budget("alpha").held
    assert held > 0
    for send in (1, 2):
        assert leases.line_start(line.pk, send)
        _lapse(line)
        ended, again = leases.lines_watch([line.pk])
    assert again == [] and ended == {line.pk: (State.FAILED, 0, 0)}
    line.refresh_from_db()
    assert line.state == State.FAILED and line.error == leases.WORKER_LOST and line.runs == leases.MAX_RUNS
    assert year_budget("alpha").held == 0  # given back
    assert LedgerEntry.objects.get(request_id=line.ledger_key, kind="release").reason == "worker_lost"
    assert not leases.line_start(line.pk, 3)
    assert leases.lines_watch([line.pk]) == ({line.pk: (State.FAILED, 0, 0)}, [])


def test_a_lapsed_line_past_its_window_expires_with_its_hold_released(world):
    (line,) = _sent(world)
    Batch.objects.filter(pk=line.batch_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    _lapse(line)
    assert leases.lines_watch([line.pk]) == ({line.pk: (State.EXPIRED, 0, 0)}, [])
    assert LedgerEntry.objects.get(request_id=line.ledger_key, kind="release").reason == "batch_expired"
    assert year_budget("alpha").held == 0


def test_a_running_line_keeps_its_lease_and_a_stale_run_renews_nothing(world):
    (line,) = _sent(world)
    assert leases.line_start(line.pk, 1)
    _lapse(line)
    assert leases.leases_renew({line.pk: 1}) == 1
    assert leases.lines_watch([line.pk]) == ({}, [])  # renewed: not lapsed
    _lapse(line)
    assert leases.lines_watch([line.pk]) == ({}, [(line.pk, 2)])
    assert leases.leases_renew({line.pk: 1}) == 0  # the run taken for dead renews nothing


def test_lapsed_sent_lines_of_a_gone_process_go_back_and_a_twice_run_one_fails(world):
    fresh, twice, running = _sent(world, owner="dead", lines=3, held=False)
    for send in (1, 2):
        BatchLine.objects.filter(pk=twice.pk).update(sends=send)
        assert leases.line_start(twice.pk, send)
    assert leases.line_start(running.pk, 1)  # its worker is alive: leased
    _lapse(fresh)
    _lapse(twice)
    now = timezone.now()
    gone = GatewayProcess.objects.create(owner="dead", host="h", pid=1, started_at=now, beat_at=now)
    assert service.requeue_lines_of_gone_processes() == 0  # its holds not released yet: still its
    gone.released_at = now
    gone.save()
    assert service.requeue_lines_of_gone_processes() == 2
    states = dict(BatchLine.objects.values_list("pk", "state"))
    assert states == {fresh.pk: State.PENDING, twice.pk: State.FAILED, running.pk: State.SENT}
    (again,) = service.lines_claim(owner="alive", room=3)
    assert again.pk == fresh.pk and service.public_id_of(again).endswith("~2") and again.ledger_key == ""


def test_a_line_sent_before_leases_existed_is_taken_as_lapsed(world):
    (line,) = _sent(world)
    BatchLine.objects.filter(pk=line.pk).update(lease_until=None)  # as the old code left it
    assert leases.lines_watch([line.pk]) == ({}, [(line.pk, 2)])
