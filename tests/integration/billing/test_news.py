"""Billing's news after commit: the charges a booking appended and the alerts it raised, sent to
receivers where they were booked, or kept for the gateway inside its billing worker (which sends
them back with its answer, for the gateway to announce where the console watches)."""

from __future__ import annotations

from decimal import Decimal as D

import pytest

from billing import news
from billing.news import AlertRaised, alerts_raised, charges_booked
from billing.services import ledger_adjust
from tests.integration.billing.helpers import hold, settle

pytestmark = pytest.mark.django_db


@pytest.fixture
def heard():
    got: dict[str, list] = {"charges": [], "alerts": []}

    def on_charges(sender, charges, **kwargs):
        got["charges"] += charges

    def on_alerts(sender, alerts, **kwargs):
        got["alerts"] += alerts

    charges_booked.connect(on_charges, dispatch_uid="test-news-charges")
    alerts_raised.connect(on_alerts, dispatch_uid="test-news-alerts")
    yield got
    charges_booked.disconnect(dispatch_uid="test-news-charges")
    alerts_raised.disconnect(dispatch_uid="test-news-alerts")


def _book_a_charge_that_crosses_80_percent(world, capture):
    with capture(execute=False) as callbacks:  # not committed yet: nothing announced
        ledger_adjust(tenant_slug="alpha", amount=D("799.99"), reason="seed", author="t")
        hold("n1")
        settle("n1", prompt=10_000)
    return callbacks


def test_charges_and_alerts_are_announced_once_committed(world, heard, django_capture_on_commit_callbacks):
    callbacks = _book_a_charge_that_crosses_80_percent(world, django_capture_on_commit_callbacks)
    assert heard == {"charges": [], "alerts": []}
    for callback in callbacks:
        callback()
    [charge] = heard["charges"]
    assert charge.kind == "charge" and charge.request_id.endswith("n1") and charge.tenant_id == world["alpha"].pk
    [alert] = heard["alerts"]
    assert isinstance(alert, AlertRaised) and alert.tenant_id == world["alpha"].pk and alert.threshold_pct == 80


def test_in_the_billing_worker_news_is_kept_for_the_gateway_not_sent(
    world, heard, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(news, "_kept", None)
    news.keep_for_the_gateway()
    for callback in _book_a_charge_that_crosses_80_percent(world, django_capture_on_commit_callbacks):
        callback()
    assert heard == {"charges": [], "alerts": []}  # the console's receivers in the worker hear nothing
    charges, alerts = news.taken()
    assert [c.request_id[-2:] for c in charges] == ["n1"] and [a.threshold_pct for a in alerts] == [80]
    assert news.taken() == ([], [])  # taken once
    monkeypatch.setattr(news, "_kept", None)
    news.announce(charges=charges, alerts=alerts)  # the gateway, with the worker's answer
    assert heard["charges"] == list(charges) and heard["alerts"] == alerts
