"""Billing's live events after commit (events.publish_on_commit): the charges a booking appended
and the alerts it raised, sent to subscribers where they were booked, or relayed inside the
gateway's billing worker (which sends them back with its answer, for the gateway to send where
the console watches). Replaces the tests of the removed signals and news buffer."""

from __future__ import annotations

from decimal import Decimal as D

import pytest
from django.db import transaction

import events
from billing.models import TenantBilling
from billing.services import ledger_adjust
from events import bus
from tests.integration.billing.helpers import hold, settle

pytestmark = pytest.mark.django_db


@pytest.fixture
def heard():
    got: dict[str, list] = {"charge": [], "alert": []}

    def on_committed(committed):
        for event in committed:
            got[event.kind].append(event)

    events.subscribe("test-news", on_committed)
    yield got
    events.unsubscribe("test-news")


def _book_a_charge_that_crosses_80_percent(world, capture):
    TenantBilling.objects.create(tenant=world["alpha"], alert_thresholds_pct=[80, 100])  # the seed crosses no other
    with capture(execute=False) as callbacks:  # not committed yet: nothing sent
        ledger_adjust(tenant_slug="alpha", amount=D("799.99"), reason="seed", author="t")
        hold("n1")
        settle("n1", prompt=10_000)
    return callbacks


def test_charges_and_alerts_are_sent_once_committed(world, heard, django_capture_on_commit_callbacks):
    callbacks = _book_a_charge_that_crosses_80_percent(world, django_capture_on_commit_callbacks)
    assert heard == {"charge": [], "alert": []}
    for callback in callbacks:
        callback()
    [charge] = heard["charge"]
    assert charge.payload["request_id"].endswith("n1") and charge.tenant_id == world["alpha"].pk
    [alert] = heard["alert"]
    assert alert.tenant_id == world["alpha"].pk and alert.payload["threshold_pct"] == 80


def test_in_the_billing_worker_events_are_relayed_to_the_gateway_not_sent(
    world, heard, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(bus, "_relayed", None)
    events.relay()
    for callback in _book_a_charge_that_crosses_80_percent(world, django_capture_on_commit_callbacks):
        callback()
    assert heard == {"charge": [], "alert": []}  # the console's subscriber in the worker hears nothing
    relayed = events.relayed()
    committed = events.Committed(relayed)
    assert [e.payload["request_id"][-2:] for e in committed if e.kind == "charge"] == ["n1"]
    assert [e.payload["threshold_pct"] for e in committed if e.kind == "alert"] == [80]
    assert events.relayed() == {}  # taken once
    monkeypatch.setattr(bus, "_relayed", None)
    events.send(relayed)  # the gateway, with the worker's answer
    assert heard["charge"] == [e for e in committed if e.kind == "charge"]
    assert heard["alert"] == [e for e in committed if e.kind == "alert"]


def test_an_event_of_a_rolled_back_transaction_is_never_sent(world, heard, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            events.publish_on_commit("charge", world["alpha"].pk, {"request_id": "kept"})
            try:
                with transaction.atomic():
                    events.publish_on_commit("charge", world["alpha"].pk, {"request_id": "gone"})
                    raise RuntimeError
            except RuntimeError:
                pass
    assert [e.payload["request_id"] for e in heard["charge"]] == ["kept"]
