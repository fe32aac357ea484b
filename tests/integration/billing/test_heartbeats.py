"""Crash leftovers: the holds of a gateway process whose heartbeat stopped are released; a live
process never loses its holds to another's sweep, not even right after a database outage."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.utils import timezone

from billing.booking import book
from billing.booking_asks import HoldAsk
from billing.heartbeats import heartbeat_beat, heartbeat_stop, holds_release_orphaned, processes_dead
from billing.models import LedgerEntry
from billing.selectors import ledger_mismatches
from tests.integration.billing.helpers import year_budget

pytestmark = pytest.mark.django_db
DEAD_AFTER = timedelta(seconds=30)


def hold_as(owner: str, request_id: str, *, at=None):
    """A hold booked by ``owner`` (at ``at``, else now)."""
    return book(
        [
            HoldAsk(
                request_id=request_id,
                tenant_slug="alpha",
                class_name="INTERACTIVE",
                model="m",
                prompt_tokens=1000,
                max_output_tokens=500,
                at=at or timezone.now(),
                owner=owner,
            )
        ]
    )[0]


def open_holds() -> set[str]:
    released = set(LedgerEntry.objects.filter(kind="release").values_list("request_id", flat=True))
    return set(LedgerEntry.objects.filter(kind="hold").values_list("request_id", flat=True)) - released


def test_a_dead_process_loses_its_holds_and_a_live_one_keeps_them(world, settings):
    settings.FAIRGATE_PROCESS_DEAD_AFTER_S = 30
    now = timezone.now()
    heartbeat_beat(owner="h:1:a", pid=1, now=now - DEAD_AFTER - timedelta(seconds=1))  # silent since
    heartbeat_beat(owner="h:2:b", pid=2, now=now)
    hold_as("h:1:a", "dead-1"), hold_as("h:1:a", "dead-2"), hold_as("h:2:b", "live-1")
    assert year_budget("alpha").held == D("9.6")
    assert processes_dead(now=now) == ["h:1:a"]
    assert holds_release_orphaned(now=now) == 2
    assert open_holds() == {"live-1"}
    assert year_budget("alpha").held == D("3.2")
    assert holds_release_orphaned(now=now) == 0  # done once
    assert processes_dead(now=now) == []
    assert ledger_mismatches() == []


def test_a_clean_stop_releases_at_once(world):
    heartbeat_beat(owner="h:1:a", pid=1)
    hold_as("h:1:a", "r1")
    assert holds_release_orphaned() == 0
    heartbeat_stop(owner="h:1:a")
    assert holds_release_orphaned() == 1
    assert open_holds() == set()


def test_after_an_outage_nobody_is_taken_for_dead_until_every_process_could_beat_again(world, settings):
    settings.FAIRGATE_PROCESS_DEAD_AFTER_S = 30
    outage_end = timezone.now()
    before = outage_end - timedelta(minutes=5)  # the database was out for five minutes
    heartbeat_beat(owner="h:1:a", pid=1, now=before)
    heartbeat_beat(owner="h:2:b", pid=2, now=before)
    hold_as("h:2:b", "r1")
    heartbeat_beat(owner="h:1:a", pid=1, recovered=True, now=outage_end)  # a beats first; b not yet
    assert processes_dead(now=outage_end + timedelta(seconds=5)) == []
    assert holds_release_orphaned(now=outage_end + timedelta(seconds=5)) == 0
    # b never came back: a full bound after the outage it is dead (a kept beating)
    heartbeat_beat(owner="h:1:a", pid=1, now=outage_end + DEAD_AFTER)
    assert processes_dead(now=outage_end + DEAD_AFTER + timedelta(seconds=1)) == ["h:2:b"]


def test_a_process_that_wakes_up_is_alive_again_and_its_new_holds_are_kept(world):
    now = timezone.now()
    heartbeat_beat(owner="h:1:a", pid=1, now=now - timedelta(minutes=2))
    hold_as("h:1:a", "before")
    assert holds_release_orphaned(now=now) == 1
    heartbeat_beat(owner="h:1:a", pid=1, now=now)  # it was only paused
    hold_as("h:1:a", "after")
    assert holds_release_orphaned(now=now) == 0
    assert open_holds() == {"after"}
