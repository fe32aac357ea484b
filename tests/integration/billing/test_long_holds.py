"""Long requests keep their holds: no sweep releases a live owner's hold by age (a 3-hour stream or
batch line, on an injected clock), a dead owner's is released, holds with no owner to ask go by
age, and the operator's forced release is the only one that ignores liveness."""

from __future__ import annotations

import io
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing import tasks
from billing.errors import BudgetExhausted
from billing.heartbeats import heartbeat_beat, holds_release_leftovers
from billing.models import LedgerEntry
from billing.selectors import ledger_mismatches
from billing.services import ledger_adjust
from tests.integration.billing.helpers import hold, settle, year_budget
from tests.integration.billing.test_heartbeats import hold_as as heartbeats_hold_as

pytestmark = pytest.mark.django_db
LIVE = "h:1:live"
RUN = timedelta(hours=3)
SWEEP = timedelta(minutes=5)


def hold_as(owner: str, request_id: str, *, at):
    held = heartbeats_hold_as(owner, request_id, at=at)
    assert not isinstance(held, BaseException), held
    return held


def release_reason(request_id: str) -> str | None:
    return LedgerEntry.objects.filter(request_id=request_id, kind="release").values_list("reason", flat=True).first()


def fill_the_budget() -> None:
    budget = year_budget("alpha")
    ledger_adjust(tenant_slug="alpha", amount=budget.limit - budget.spent - budget.held, reason="fill", author="t")


def run_for_three_hours(*, start, owner_beats_until) -> None:
    """The clock moves from ``start`` over three hours, a sweep every five minutes, each on the
    injected clock; the owner beats just before each sweep until ``owner_beats_until``."""
    at = start
    while at <= start + RUN:
        if at <= owner_beats_until:
            heartbeat_beat(owner=LIVE, pid=1, now=at)
        holds_release_leftovers(now=at)
        at += SWEEP


def test_a_three_hour_request_keeps_its_hold_while_its_owner_lives_and_is_charged_in_full(world, settings):
    settings.FAIRGATE_PROCESS_DEAD_AFTER_S = 30
    now = timezone.now()
    start = now - RUN
    heartbeat_beat(owner=LIVE, pid=1, now=start)
    hold_as(LIVE, "long-stream", at=start)
    fill_the_budget()  # nothing left beside the hold: a released hold's money would go to others
    run_for_three_hours(start=start, owner_beats_until=now)
    heartbeat_beat(owner=LIVE, pid=1, now=now)
    assert tasks.holds_sweep() == 0  # beat's sweep, on the real clock
    assert tasks.holds_release_at_startup(sole_process=False) == 0  # another gateway starting
    call_command("ledger", "sweep", stdout=io.StringIO())  # the operator's sweep
    assert release_reason("long-stream") is None
    with pytest.raises(BudgetExhausted):  # the hold still reserves its money
        hold("someone-else")
    assert settle("long-stream", at=now) == D("1.12")
    charge = LedgerEntry.objects.get(request_id="long-stream", kind="charge")
    assert (charge.amount, charge.unbilled) == (D("1.12"), D("0"))
    assert ledger_mismatches() == []


def test_a_three_hour_request_whose_owner_died_loses_its_hold(world, settings):
    settings.FAIRGATE_PROCESS_DEAD_AFTER_S = 30
    now = timezone.now()
    start = now - RUN
    heartbeat_beat(owner=LIVE, pid=1, now=start)
    hold_as(LIVE, "long-stream", at=start)
    run_for_three_hours(start=start, owner_beats_until=start + timedelta(hours=1))  # then killed
    assert release_reason("long-stream") == "owner_gone"
    assert year_budget("alpha").held == D("0")
    assert settle("long-stream", at=now) == D("1.12")  # a late settlement still charges what the budget has
    assert ledger_mismatches() == []


def test_holds_with_no_owner_to_ask_are_released_by_age_only(world, settings):
    settings.FAIRGATE_BILLING_STALE_HOLD_S = 7200
    now = timezone.now()
    heartbeat_beat(owner=LIVE, pid=1, now=now)
    hold("script-old", at=now - RUN)  # billing.services.budget_hold with no owner: a script, a shell
    hold("script-young", at=now - timedelta(hours=1))
    hold_as("h:9:never-beat", "no-heartbeat", at=now - RUN)  # names an owner that never beat
    hold_as(LIVE, "live-old", at=now - RUN)
    assert tasks.holds_sweep() == 2
    assert release_reason("script-old") == release_reason("no-heartbeat") == "stale"
    assert release_reason("script-young") is None and release_reason("live-old") is None
    assert ledger_mismatches() == []


def test_the_operators_forced_release_ignores_liveness_and_says_so(world):
    now = timezone.now()
    heartbeat_beat(owner=LIVE, pid=1, now=now)
    hold_as(LIVE, "live-old", at=now - RUN)
    hold_as(LIVE, "live-young", at=now - timedelta(minutes=10))
    out = io.StringIO()
    call_command("ledger", "sweep", "--older-than-s", "0", stdout=out)
    assert "released 0 holds of dead processes and 0 stale holds with no owner" in out.getvalue()
    call_command("ledger", "release-forced", "--older-than-s", "3600", stdout=out)
    assert "released 1 open holds older than 1:00:00, forced" in out.getvalue()
    assert (release_reason("live-old"), release_reason("live-young")) == ("forced", None)
    assert settle("live-old") == D("1.12")  # a late settlement after a forced release charges once
    assert ledger_mismatches() == []


def test_the_sole_embedded_process_releases_every_leftover_at_start(world):
    now = timezone.now()
    hold_as(LIVE, "earlier-run", at=now - timedelta(minutes=1))
    hold("script", at=now - timedelta(minutes=1))
    assert tasks.holds_release_at_startup(sole_process=True) == 2
    assert release_reason("earlier-run") == "owner_gone"
