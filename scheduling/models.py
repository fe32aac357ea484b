"""The live scheduler configuration, as rows. `scheduling.mapping` turns these rows into the
engine's plain `SchedulerConfig` and back; nothing is deleted that history may refer to. Beside
it, what the engine learned that outlives a process (`LearnedProfile`).
"""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models

from scheduling.engine.model import Dialect


class PriorityClass(models.Model):
    name = models.CharField(max_length=32, unique=True)
    level = models.PositiveIntegerField(help_text="0 is served first.")
    sla_ms = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["level", "name"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return self.name


class SchedulerPolicy(models.Model):
    """Singleton (pk=1): the global policy knobs of the YAML's aging, headroom, fairness and queue sections."""

    class AgingMode(models.TextChoices):
        PIECEWISE = "piecewise"
        LINEAR = "linear"
        NONE = "none"

    class FairnessMode(models.TextChoices):
        WEIGHTED_FAIR_TOKENS = "weighted_fair_tokens"
        WEIGHTED_ROUND_ROBIN = "weighted_round_robin"
        FIFO = "fifo"

    policy = models.CharField(max_length=16, default="fairgate")
    aging_mode = models.CharField(max_length=16, choices=AgingMode.choices, default=AgingMode.PIECEWISE)
    fairness_mode = models.CharField(
        max_length=32, choices=FairnessMode.choices, default=FairnessMode.WEIGHTED_FAIR_TOKENS
    )
    weight_source = models.CharField(max_length=32, default="quota_share")
    min_share = models.FloatField(default=0.02)
    queue = models.JSONField(default=dict, help_text="The queue section (depth_cap, codes, extensions).")
    headroom = models.JSONField(default=dict, blank=True, help_text="The headroom section (predictive headroom).")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "scheduler policy"

    def __str__(self) -> str:
        return f"policy={self.policy} aging={self.aging_mode} fairness={self.fairness_mode}"


class AgingSegment(models.Model):
    class BoostKind(models.TextChoices):
        NONE = "none"
        LINEAR = "linear"
        QUADRATIC = "quadratic"
        PREEMPT = "preempt"

    position = models.PositiveIntegerField(unique=True)
    wait_ratio_lo = models.FloatField()
    wait_ratio_hi = models.FloatField(null=True, blank=True, help_text="Empty: open-ended.")
    boost = models.CharField(max_length=16, choices=BoostKind.choices)
    k = models.FloatField(default=0.0)

    class Meta:
        ordering = ["position"]

    def __str__(self) -> str:
        hi = "" if self.wait_ratio_hi is None else f"{self.wait_ratio_hi:g}"
        return f"{self.wait_ratio_lo:g}-{hi}: {self.boost} k={self.k:g}"


class NetworkGroup(models.Model):
    name = models.CharField(max_length=64, unique=True)
    cidrs = models.JSONField(default=list)
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DowngradeRule(models.Model):
    name = models.CharField(max_length=64, unique=True)
    condition = models.TextField()
    action = models.CharField(max_length=64)
    enabled = models.BooleanField(default=True)
    order = models.PositiveIntegerField(default=0)
    active = models.BooleanField(default=True, help_text="False once absent from a loaded file.")

    class Meta:
        ordering = ["order", "name"]

    def __str__(self) -> str:
        return self.name


class Backend(models.Model):
    name = models.CharField(max_length=64, unique=True)
    url = models.URLField(max_length=500, blank=True)
    model_names = models.JSONField(default=list, help_text="Model names this backend serves.")
    embedding_models = models.JSONField(
        default=list, blank=True, help_text="Those of its models that embed (served at /v1/embeddings only)."
    )
    slots = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tpm = models.PositiveIntegerField(null=True, blank=True)
    rpm = models.PositiveIntegerField(null=True, blank=True)
    input_price_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    output_price_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    fallback_for = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="fallbacks")
    reserved_slots = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    # How to talk to it (scheduling.upstreams). Names of environment variables only, never a secret.
    api_key_env = models.CharField(
        max_length=128, blank=True, help_text="The environment variable holding its API key (its name, not the key)."
    )
    headers = models.JSONField(
        default=dict, blank=True, help_text='Extra headers; a value "env:NAME" is read from NAME.'
    )
    dialect = models.CharField(
        max_length=16, choices=[(d.value, d.value) for d in Dialect], default=Dialect.OPENAI.value
    )
    deployment = models.CharField(max_length=128, blank=True, help_text="Azure: the deployment (default: the model).")
    api_version = models.CharField(max_length=32, blank=True, help_text="Azure: the api-version.")

    upstream_shown: str  # not a column: set where a page lists backends (scheduling.upstreams)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class LearnedProfile(models.Model):
    """What the engine learned that outlives its process, one row per name (``demand``: predicted
    admission's time-of-day profile, on the wall clock's buckets; gateway.demand_store)."""

    name = models.CharField(max_length=64, unique=True)
    record = models.JSONField(help_text="The profile as plain data (its as_record()).")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
