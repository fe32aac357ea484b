"""Budget alerts at the tenant's thresholds (50, 80 and 100 % by default): stored once per budget
and threshold, logged, then delivered after commit to the tenant's webhook (signed, in its format:
billing.webhooks) and by e-mail by a Celery task; an undelivered one is retried with growing gaps,
then shown to admins as failed."""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from functools import partial

import httpx
from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from billing import news
from billing.budgets import alert_thresholds, billing_of
from billing.models import Budget, BudgetAlert, LedgerEntry
from billing.periods import fiscal_tz
from billing.webhooks import headline, request_of
from events import publish_on_commit

logger = logging.getLogger("fairgate.billing.alerts")
WEBHOOK_TIMEOUT_S = 5.0
MAX_DELIVERY_ATTEMPTS = 5
RETRY_FIRST = timedelta(minutes=1)  # the gap after the first failed attempt, doubled after each one


def alerts_record(*, budget: Budget, thresholds_pct: list[int]) -> list[BudgetAlert]:
    """Store the crossings of the tenant's alert thresholds among ``thresholds_pct`` (inside the
    caller's transaction) and deliver them once it commits."""
    created: list[BudgetAlert] = []
    limit = budget.limit
    if limit is None:  # an unlimited budget crosses no threshold (and an alert's limit is NOT NULL)
        return created
    kept = alert_thresholds(billing_of(budget.tenant))
    for pct in (p for p in thresholds_pct if p in kept):
        try:
            with transaction.atomic():
                alert = BudgetAlert.objects.create(budget=budget, threshold_pct=pct, spent=budget.spent, limit=limit)
        except IntegrityError:  # this threshold already alerted for this budget
            continue
        logger.warning(
            "budget %s crossed %s%%: spent %s of %s %s",
            budget.label,
            pct,
            budget.spent,
            budget.limit,
            settings.FAIRGATE_CURRENCY,
        )
        transaction.on_commit(partial(_enqueue, alert.pk))
        publish_on_commit(news.ALERT, budget.tenant_id, news.alert_news(alert))
        created.append(alert)
    return created


def _enqueue(alert_pk: int) -> None:
    alert_deliver.delay(alert_pk)


def alert_payload(alert: BudgetAlert) -> dict:
    budget = alert.budget
    forecast = alert.kind == BudgetAlert.Kind.FORECAST
    extra = {"runs_out_on": alert.runs_out_on.isoformat()} if forecast and alert.runs_out_on else {}
    return {
        **extra,
        "type": "budget.forecast" if forecast else "budget.threshold_crossed",
        "tenant": budget.tenant.slug,
        "budget": budget.label,
        "period": {
            "kind": budget.kind,
            "starts_at": budget.starts_at.isoformat(),
            "ends_at": budget.ends_at.isoformat(),
        },
        "threshold_pct": alert.threshold_pct,
        "spent": str(alert.spent),
        "limit": str(alert.limit),
        "currency": settings.FAIRGATE_CURRENCY,
        "at": alert.created_at.isoformat(),
    }


def _recipients(budget: Budget) -> list[str]:
    row = billing_of(budget.tenant)
    if row is not None and row.alert_emails.strip():
        return [a.strip() for a in row.alert_emails.split(",") if a.strip()]
    return sorted({u.email for u in budget.tenant.users.filter(is_active=True) if u.email})


def alert_deliver_now(*, alert_id: int) -> BudgetAlert:
    """Deliver what is not yet delivered; errors are recorded, never raised (a later sweep retries)."""
    alert = BudgetAlert.objects.select_related("budget__tenant__billing").get(pk=alert_id)
    payload = alert_payload(alert)
    errors: list[str] = []
    row = billing_of(alert.budget.tenant)
    if alert.webhook_delivered_at is None:
        if row is None or not row.webhook_url:
            alert.webhook_delivered_at = timezone.now()  # nothing to deliver to
        else:
            if not row.webhook_secret:
                row.save()  # makes its secret
            content, headers = request_of(payload, row.webhook_format, row.webhook_secret)
            try:
                httpx.post(
                    row.webhook_url, content=content, headers=headers, timeout=WEBHOOK_TIMEOUT_S
                ).raise_for_status()
                alert.webhook_delivered_at = timezone.now()
            except httpx.HTTPError as exc:
                errors.append(f"webhook: {exc}")
    if alert.email_delivered_at is None:
        try:
            recipients = _recipients(alert.budget)
            if recipients:
                if alert.kind == BudgetAlert.Kind.FORECAST:
                    subject = f"[Fairgate] budget {payload['budget']} runs out on {payload['runs_out_on']}"
                else:
                    subject = f"[Fairgate] budget {payload['budget']} crossed {alert.threshold_pct}%"
                send_mail(subject, headline(payload), None, recipients)
            alert.email_delivered_at = timezone.now()
        except Exception as exc:  # SMTP errors come in many types
            errors.append(f"email: {exc}")
    alert.delivery_attempts += 1
    alert.delivery_error = "; ".join(errors)
    alert.last_attempt_at = timezone.now()
    fields = ["webhook_delivered_at", "email_delivered_at", "delivery_attempts", "delivery_error", "last_attempt_at"]
    alert.save(update_fields=fields)
    if errors:
        logger.error("budget alert %s not fully delivered: %s", alert.pk, alert.delivery_error)
    return alert


@shared_task(name="billing.alert_deliver", ignore_result=True)
def alert_deliver(alert_id: int) -> None:
    """The Celery task that delivers one alert (here, not in billing.tasks, which imports this
    module: recording an alert enqueues it)."""
    alert_deliver_now(alert_id=alert_id)


def alerts_pending_ids(*, older_than: timedelta = timedelta(minutes=1)) -> list[int]:
    """Alerts still undelivered whose next try is due: not brand new (its on-commit delivery may be
    under way), and past the gap after their last failed attempt (RETRY_FIRST, doubled each time)."""
    now = timezone.now()
    undelivered = Q(webhook_delivered_at__isnull=True) | Q(email_delivered_at__isnull=True)
    found = BudgetAlert.objects.filter(
        undelivered, delivery_attempts__lt=MAX_DELIVERY_ATTEMPTS, created_at__lt=now - older_than
    ).values_list("pk", "delivery_attempts", "last_attempt_at")
    return [pk for pk, attempts, last in found if last is None or now >= last + retry_gap(attempts)]


def retry_gap(attempts: int) -> timedelta:
    """How long after its ``attempts``-th failed attempt an alert is tried again."""
    return RETRY_FIRST * (2 ** max(attempts - 1, 0))


def alerts_failed():
    """Alerts whose delivery gave up (every attempt failed), newest first: for the admins' page."""
    undelivered = Q(webhook_delivered_at__isnull=True) | Q(email_delivered_at__isnull=True)
    return (
        BudgetAlert.objects.filter(undelivered, delivery_attempts__gte=MAX_DELIVERY_ATTEMPTS)
        .select_related("budget__tenant")
        .order_by("-created_at")
    )


FORECAST_WINDOW = timedelta(days=7)  # the burn is the charges of the last week (or of the period so far)
FORECAST_MIN_HISTORY = timedelta(days=1)  # a period younger than this is not forecast


def budgets_forecast(*, now=None) -> list[BudgetAlert]:
    """For every current budget with a limit and no forecast alert yet: if its charges over the last
    FORECAST_WINDOW, continued, use up what is left before the period ends, one forecast alert
    (delivered as the threshold alerts are). Returns the alerts raised."""
    now = now or timezone.now()
    raised: list[BudgetAlert] = []
    current = (
        Budget.objects.filter(starts_at__lte=now - FORECAST_MIN_HISTORY, ends_at__gt=now, limit__isnull=False)
        .exclude(alerts__kind=BudgetAlert.Kind.FORECAST)
        .select_related("tenant")
    )
    for budget in current:
        since = max(budget.starts_at, now - FORECAST_WINDOW)
        mine = Q(month_budget=budget) if budget.kind == Budget.Kind.MONTH else Q(budget=budget)
        charges = LedgerEntry.objects.filter(mine, kind=LedgerEntry.Kind.CHARGE, at__gte=since, at__lt=now)
        burned = charges.aggregate(total=Sum("amount"))["total"] or Decimal(0)
        limit = budget.limit
        if limit is None:
            continue
        left = limit - budget.spent - budget.held
        if burned <= 0 or left <= 0:
            continue
        runs_out = now + (now - since) * float(left / burned)
        if runs_out >= budget.ends_at:
            continue
        with transaction.atomic():
            try:
                with transaction.atomic():
                    alert = BudgetAlert.objects.create(
                        budget=budget,
                        kind=BudgetAlert.Kind.FORECAST,
                        threshold_pct=0,
                        spent=budget.spent,
                        limit=limit,
                        runs_out_on=runs_out.astimezone(fiscal_tz()).date(),
                    )
            except IntegrityError:  # forecast by another run meanwhile
                continue
            logger.warning("budget %s runs out on %s at the current burn", budget.label, alert.runs_out_on)
            transaction.on_commit(partial(_enqueue, alert.pk))
            publish_on_commit(news.ALERT, budget.tenant_id, news.alert_news(alert))
        raised.append(alert)
    return raised
