"""Budgets, the append-only ledger, and budget alerts.

A `Budget` row is one spending period of one tenant: its fiscal year, or (when the tenant has a
monthly cap) one fiscal month. `spent` and `held` are denormalised sums of the ledger, kept in the
same transaction as the entries that move them; `manage.py ledger verify` recomputes them.

Ledger entries are never updated or deleted: the model refuses, its queryset refuses, and database
triggers (migration 0002) refuse raw SQL too. A correction is a new `adjustment` entry.
"""

from __future__ import annotations

import secrets
from decimal import Decimal
from typing import TypedDict

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models


class MoneyOptions(TypedDict):
    """A money column's precision, spread into its DecimalField (typed: the keys it fills)."""

    max_digits: int
    decimal_places: int


MONEY: MoneyOptions = {"max_digits": 20, "decimal_places": 6}
ZERO = Decimal("0")


def alert_thresholds_valid(value) -> None:
    if not isinstance(value, list) or not all(isinstance(p, int) and 1 <= p <= 100 for p in value):
        raise ValidationError("give whole percents from 1 to 100, e.g. [50, 80, 100]")


class TenantBilling(models.Model):
    """Optional billing settings of a tenant (kept out of tenants.Tenant)."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.PROTECT, related_name="billing")
    monthly_cap = models.DecimalField(**MONEY, null=True, blank=True, help_text="Empty: no monthly cap.")
    fallback_on_exhausted = models.BooleanField(
        default=False, help_text="When the budget cannot hold a request, fall back to a cheaper class that fits."
    )

    class WebhookFormat(models.TextChoices):
        JSON = "json", "Fairgate JSON (signed)"
        SLACK = "slack", "Slack incoming webhook"
        TEAMS = "teams", "Microsoft Teams workflow (Adaptive Card)"

    webhook_url = models.URLField(max_length=500, blank=True, help_text="Budget alerts are POSTed here.")
    webhook_format = models.CharField(max_length=8, choices=WebhookFormat.choices, default=WebhookFormat.JSON)
    webhook_secret = models.CharField(
        max_length=64,
        blank=True,
        help_text="Signs every delivery (X-Fairgate-Signature, docs/billing-and-console.md); made when empty.",
    )
    alert_emails = models.CharField(max_length=500, blank=True, help_text="Comma-separated; empty: the tenant's users.")
    alert_thresholds_pct = models.JSONField(
        default=list,
        blank=True,
        validators=[alert_thresholds_valid],
        help_text="Percents of the limit at which its budgets alert, e.g. [50, 80, 100]; empty: those.",
    )

    class Meta:
        verbose_name_plural = "tenant billing settings"

    def save(self, *args, **kwargs) -> None:
        if self.webhook_url and not self.webhook_secret:
            self.webhook_secret = secrets.token_hex(32)
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"billing of {self.tenant_id}"


class Budget(models.Model):
    class Kind(models.TextChoices):
        YEAR = "year", "Fiscal year"
        MONTH = "month", "Fiscal month"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="budgets")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    fiscal_year = models.PositiveIntegerField(help_text="Calendar year in which the fiscal year starts.")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    limit = models.DecimalField(**MONEY, null=True, blank=True, help_text="Empty: unlimited.")
    spent = models.DecimalField(**MONEY, default=ZERO)
    held = models.DecimalField(**MONEY, default=ZERO)

    class Meta:
        ordering = ["tenant_id", "starts_at", "kind"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind", "starts_at"], name="billing_budget_one_per_period"),
            models.CheckConstraint(condition=models.Q(held__gte=0), name="billing_budget_held_not_negative"),
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        if self.kind == self.Kind.YEAR:
            return f"{self.tenant.slug} FY{self.fiscal_year}"
        return f"{self.tenant.slug} FY{self.fiscal_year} month {self.starts_at:%Y-%m}"

    @property
    def remaining(self) -> Decimal | None:
        return None if self.limit is None else self.limit - self.spent - self.held


class AppendOnlyError(Exception):
    """Ledger entries are never changed or deleted; post an adjustment instead."""


class LedgerQuerySet(models.QuerySet):
    def of_requests(self, request_ids) -> LedgerQuerySet:
        """The hold, charge and release entries of these requests, found through the unique
        partial index on (request_id, kind): the query repeats the index's condition, the only
        form in which SQLite's planner uses a partial index (filter kinds after this, in Python
        or with a further filter that keeps the index usable)."""
        return self.filter(~models.Q(kind="adjustment"), request_id__in=list(request_ids))

    def update(self, **kwargs):
        raise AppendOnlyError("ledger entries cannot be updated")

    def delete(self):
        raise AppendOnlyError("ledger entries cannot be deleted")


class PriceVersion(models.Model):
    """A class's price factor from `effective_at` on. Never edited: a change is a new row."""

    priority_class = models.ForeignKey("scheduling.PriorityClass", on_delete=models.PROTECT, related_name="prices")
    price_factor = models.DecimalField(max_digits=8, decimal_places=4, validators=[MinValueValidator(Decimal("0"))])
    effective_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)

    upcoming: bool  # not a column: set on the versions a page lists, True for one not in effect yet
    factor_shown: str  # not a column: the factor as the policy page writes it (0.7)

    class Meta:
        db_table = "scheduling_priceversion"  # made by scheduling.0001, before prices moved here
        ordering = ["priority_class__level", "-effective_at", "-pk"]
        indexes = [models.Index(fields=["priority_class", "effective_at"], name="scheduling__priorit_2feb39_idx")]

    def __str__(self) -> str:
        return f"{self.priority_class.name} ×{self.price_factor} from {self.effective_at:%Y-%m-%d %H:%M}"


class LedgerEntry(models.Model):
    class Kind(models.TextChoices):
        HOLD = "hold", "Hold"
        CHARGE = "charge", "Charge"
        RELEASE = "release", "Release"
        ADJUSTMENT = "adjustment", "Adjustment"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Append-heavy: only the indexes its reads use (Meta.indexes and the unique constraint; the
    # tenant's composite index serves its foreign key too). Budgets and price versions are never
    # deleted, so their foreign keys need no index of their own. On PostgreSQL the four foreign keys
    # are checked once per statement by triggers, not as constraints (migration 0011).
    at = models.DateTimeField()
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="ledger_entries", db_index=False
    )
    budget = models.ForeignKey(Budget, on_delete=models.PROTECT, related_name="entries", db_index=False)
    month_budget = models.ForeignKey(
        Budget, null=True, blank=True, on_delete=models.PROTECT, related_name="month_entries", db_index=False
    )
    # tenant slug (64) + "/" + X-Request-Id (128) + an attempt's "#NN"
    request_id = models.CharField(max_length=200, blank=True)
    class_name = models.CharField(max_length=32, blank=True)
    price_version = models.ForeignKey(
        PriceVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_index=False,
    )
    model = models.CharField(max_length=200, blank=True)
    backend_name = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    base_cost = models.DecimalField(**MONEY, default=ZERO)
    factor = models.DecimalField(max_digits=8, decimal_places=4, default=Decimal("1"))
    amount = models.DecimalField(**MONEY)
    overrun = models.DecimalField(
        **MONEY, default=ZERO, help_text="Charged beyond the hold (before holds bounded every charge: always 0 now)."
    )
    unbilled = models.DecimalField(
        **MONEY,
        default=ZERO,
        help_text="What the backend's usage priced beyond what could be charged: beyond the hold, or, for a late "
        "settlement after the hold was released, beyond what the budget still had.",
    )
    owner = models.CharField(
        max_length=100,
        blank=True,
        help_text="The gateway process whose request this is (billing.heartbeats); empty: booked outside one.",
    )
    reason = models.CharField(max_length=500, blank=True)
    author = models.CharField(max_length=150, blank=True)
    # Who spent (copied from the hold to its release and charge; empty on rows older than them and
    # on adjustments): the API key's public prefix, the job (X-Job-Id, or a batch line's batch id),
    # and who created the key (tenants.ApiKey.created_by). A database default too: a process of the
    # previous release still appending without them during an upgrade writes empty values.
    key_prefix = models.CharField(max_length=16, blank=True, default="", db_default="")
    job_id = models.CharField(max_length=128, blank=True, default="", db_default="")
    key_creator = models.CharField(max_length=150, blank=True, default="", db_default="")

    objects = LedgerQuerySet.as_manager()

    class Meta:
        ordering = ["at", "pk"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(
                fields=["request_id", "kind"],
                condition=~models.Q(kind="adjustment"),
                name="billing_ledger_once_per_request_and_kind",
            ),
        ]
        indexes = [
            models.Index(fields=["kind", "at"]),
            models.Index(fields=["tenant", "kind", "at"]),
            # the holds of a process that died (billing.heartbeats)
            models.Index(fields=["owner"], condition=models.Q(kind="hold"), name="billing_ledger_hold_owner"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.tenant_id} {self.request_id}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError("ledger entries cannot be updated")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("ledger entries cannot be deleted")


class BudgetAlert(models.Model):
    """A budget crossed one of its tenant's alert thresholds (once per budget and threshold), or is
    forecast to run out before its period ends at the current burn (once per budget)."""

    class Kind(models.TextChoices):
        THRESHOLD = "threshold", "Threshold crossed"
        FORECAST = "forecast", "Runs out before the period ends"

    budget = models.ForeignKey(Budget, on_delete=models.PROTECT, related_name="alerts")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.THRESHOLD)
    threshold_pct = models.PositiveSmallIntegerField()  # a forecast's: 0
    runs_out_on = models.DateField(null=True, blank=True)  # a forecast's date, in the fiscal time zone
    spent = models.DecimalField(**MONEY)
    limit = models.DecimalField(**MONEY)
    created_at = models.DateTimeField(auto_now_add=True)
    webhook_delivered_at = models.DateTimeField(null=True, blank=True)
    email_delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_attempts = models.PositiveSmallIntegerField(default=0)
    delivery_error = models.TextField(blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)  # retries back off from it (billing.alerts)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "kind", "threshold_pct"], name="billing_alert_once_per_kind_and_threshold"
            ),
        ]

    def __str__(self) -> str:
        if self.kind == self.Kind.FORECAST:
            return f"{self.budget} runs out on {self.runs_out_on}"
        return f"{self.budget} crossed {self.threshold_pct}%"


class GatewayProcess(models.Model):
    """A gateway process's heartbeat (billing.heartbeats): holds name their process, and the holds
    of one whose heartbeat stopped are released by whoever sweeps next."""

    owner = models.CharField(max_length=100, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="Set by a clean stop.")
    recovered_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Its last beat after beats had failed (the database was out): no process "
        "is taken for dead until every live one has had time to beat again.",
    )
    released_at = models.DateTimeField(
        null=True, blank=True, help_text="Taken for dead: its open holds were released then."
    )

    class Meta:
        verbose_name_plural = "gateway processes"

    def __str__(self) -> str:
        return self.owner
