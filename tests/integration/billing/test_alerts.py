"""Budget alerts at a tenant's thresholds (50, 80 and 100 % by default): stored once, logged,
delivered by webhook and e-mail, retried with growing gaps."""

from __future__ import annotations

import json
from decimal import Decimal as D

import httpx
import pytest

from billing.models import BudgetAlert, TenantBilling
from billing.services import ledger_adjust
from tests.integration.billing.helpers import hold, settle

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def eager_celery():
    """Deliver in-process even when REDIS_URL makes Celery use a real broker."""
    from config.celery import app

    was = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = was


@pytest.fixture
def webhook(monkeypatch):
    calls = []

    def fake_post(url, *, content, headers, timeout):
        calls.append((url, json.loads(content)))
        return httpx.Response(200, request=httpx.Request("POST", url))

    monkeypatch.setattr("billing.alerts.httpx.post", fake_post)
    return calls


def test_crossing_each_default_threshold_alerts_once(
    world, webhook, mailoutbox, django_capture_on_commit_callbacks, caplog
):
    TenantBilling.objects.create(
        tenant=world["alpha"], webhook_url="https://hooks.example/alpha", alert_emails="cfo@alpha.example"
    )
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("499.99"), reason="seed", author="t")
    assert not BudgetAlert.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("0.01"), reason="seed", author="t")  # exactly 50 %
        ledger_adjust(tenant_slug="alpha", amount=D("10"), reason="seed", author="t")  # no new crossing
    assert list(BudgetAlert.objects.values_list("threshold_pct", flat=True)) == [50]
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("290"), reason="seed", author="t")  # exactly 80 %
    assert sorted(BudgetAlert.objects.values_list("threshold_pct", flat=True)) == [50, 80]
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("196.8"), reason="seed", author="t")  # 3.2 left
        hold("r1")  # exactly what is left
        settle("r1", prompt=10**6)  # usage beyond the hold is charged up to the hold: crosses 100 %
    assert sorted(BudgetAlert.objects.values_list("threshold_pct", flat=True)) == [50, 80, 100]
    assert [payload["threshold_pct"] for _, payload in webhook] == [50, 80, 100]
    assert webhook[0][0] == "https://hooks.example/alpha" and webhook[0][1]["tenant"] == "alpha"
    assert [m.to for m in mailoutbox] == [["cfo@alpha.example"]] * 3 and "100%" in mailoutbox[2].subject
    assert all(a.webhook_delivered_at and a.email_delivered_at for a in BudgetAlert.objects.all())
    assert "crossed 80%" in caplog.text


def test_failed_webhook_is_recorded_for_a_retry(world, monkeypatch, django_capture_on_commit_callbacks):
    TenantBilling.objects.create(
        tenant=world["alpha"], webhook_url="https://hooks.example/down", alert_thresholds_pct=[80, 100]
    )

    def refuse(url, **kwargs):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr("billing.alerts.httpx.post", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("900"), reason="seed", author="t")
    alert = BudgetAlert.objects.get()
    assert alert.webhook_delivered_at is None and "webhook" in alert.delivery_error and alert.delivery_attempts == 1


def test_unlimited_budget_never_alerts(world):
    ledger_adjust(tenant_slug="gamma", amount=D("1000000"), reason="seed", author="t")
    assert not BudgetAlert.objects.exists()


def test_retries_back_off_then_give_up_where_admins_see_it(world, monkeypatch, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from billing.alerts import MAX_DELIVERY_ATTEMPTS, alert_deliver_now, alerts_failed, alerts_pending_ids, retry_gap

    TenantBilling.objects.create(
        tenant=world["alpha"], webhook_url="https://hooks.example/down", alert_thresholds_pct=[80, 100]
    )

    def refuse(url, **kwargs):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr("billing.alerts.httpx.post", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("900"), reason="seed", author="t")
    alert = BudgetAlert.objects.get()
    BudgetAlert.objects.filter(pk=alert.pk).update(created_at=timezone.now() - timedelta(hours=1))
    for attempts in range(1, MAX_DELIVERY_ATTEMPTS):
        just_failed = timezone.now()
        BudgetAlert.objects.filter(pk=alert.pk).update(last_attempt_at=just_failed)
        assert alerts_pending_ids() == []  # its gap has not passed
        gap = retry_gap(attempts)
        BudgetAlert.objects.filter(pk=alert.pk).update(last_attempt_at=just_failed - gap)
        assert alerts_pending_ids() == [alert.pk]
        alert_deliver_now(alert_id=alert.pk)
    assert [retry_gap(n) for n in (1, 2, 3)] == [timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=4)]
    assert BudgetAlert.objects.get(pk=alert.pk).delivery_attempts == MAX_DELIVERY_ATTEMPTS
    assert alerts_pending_ids() == [] and list(alerts_failed()) == [alert]


def test_a_tenant_sets_its_own_thresholds(world, webhook, django_capture_on_commit_callbacks):
    TenantBilling.objects.create(tenant=world["alpha"], alert_thresholds_pct=[25, 90])
    with django_capture_on_commit_callbacks(execute=True):
        ledger_adjust(tenant_slug="alpha", amount=D("950"), reason="seed", author="t")
    assert sorted(BudgetAlert.objects.values_list("threshold_pct", flat=True)) == [25, 90]
    with django_capture_on_commit_callbacks(execute=True):
        hold("r2")
        settle("r2", prompt=10**6)
    assert sorted(BudgetAlert.objects.values_list("threshold_pct", flat=True)) == [25, 90]  # 100 % is not its


def test_a_budget_burning_too_fast_gets_one_forecast_alert(world, webhook, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from billing.alerts import budgets_forecast
    from billing.models import Budget

    TenantBilling.objects.create(tenant=world["alpha"], webhook_url="https://hooks.example/alpha")
    now = timezone.now()
    hold("f1", at=now - timedelta(days=2))
    settle("f1", prompt=10**6, at=now - timedelta(days=2))  # charged up to its hold
    year = Budget.objects.get(tenant=world["alpha"], kind=Budget.Kind.YEAR)
    burned = year.spent
    assert burned > 0
    year.starts_at = now - timedelta(days=30)  # a period under way: the burn is the last 7 days' charges
    year.limit = burned * 11  # left: 10 weeks' burn, so it runs out in about 70 days
    year.ends_at = now + timedelta(days=60)
    year.save()
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets_forecast(now=now) == []  # the period ends first: no alert
    year.ends_at = now + timedelta(days=100)
    year.save()
    with django_capture_on_commit_callbacks(execute=True):
        [alert] = budgets_forecast(now=now)
        assert budgets_forecast(now=now) == []  # once per budget
    assert alert.kind == BudgetAlert.Kind.FORECAST
    expected = (now + timedelta(days=70)).date()
    assert abs((alert.runs_out_on - expected).days) <= 1
    [(_, payload)] = webhook
    assert payload["type"] == "budget.forecast" and payload["runs_out_on"] == alert.runs_out_on.isoformat()
