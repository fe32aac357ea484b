"""Who is calling: tenants (business units), their users and their API keys.

A key names a tenant; a tenant has a weight, a budget and the classes it may declare. The tables
keep the names they had when these models lived in the gateway app (``gateway_*``).
"""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.models import AbstractUser
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    quota_share = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        validators=[MinValueValidator(Decimal("0.0001")), MaxValueValidator(Decimal("1"))],
        help_text="Weight for fair sharing inside a class (0 < share <= 1).",
    )
    annual_budget = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    allowed_classes = models.JSONField(
        default=list, blank=True, help_text="Class names this tenant may declare; empty means all."
    )
    vip = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "gateway_tenant"  # moved from the gateway app without renaming its table
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(quota_share__gt=0, quota_share__lte=1), name="tenant_quota_share_range"
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class User(AbstractUser):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        FINANCE = "finance", "Finance"
        ADMIN = "admin", "Admin"

    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="users")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta(AbstractUser.Meta):
        db_table = "gateway_user"

    @property
    def sees_all_tenants(self) -> bool:
        """Finance and admins (and superusers) see every tenant's charges; members only their own."""
        return self.is_superuser or self.role in (self.Role.FINANCE, self.Role.ADMIN)


class ApiKey(models.Model):
    """The secret is shown once at creation; only its SHA-256 digest is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_keys")
    label = models.CharField(max_length=200, blank=True)
    default_class = models.CharField(max_length=32)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)  # written at most once a minute (gateway.auth)
    expires_at = models.DateTimeField(null=True, blank=True)  # refused from then on; None: never expires
    replaced_by = models.ForeignKey(  # the key a rotation issued in its place
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaces"
    )
    # Who made it: a console user's username, else the actor that did ("cli", "setup"); a rotation's
    # key keeps its original's. Every ledger entry of its requests copies it (docs/money.md).
    created_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        db_table = "gateway_apikey"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant.slug})"

    @property
    def is_active(self) -> bool:
        """Not revoked and not expired."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())

    @property
    def state(self) -> str:
        """One word for the console and `apikey list`: active, expiring, rotated, expired or revoked."""
        if self.revoked_at is not None:
            return "revoked"
        if not self.is_active:
            return "expired"
        if self.replaced_by_id is not None:
            return "rotated"
        return "active" if self.expires_at is None else "expiring"


class SignInRule(models.Model):
    """Maps one value of the identity provider's mapping claim (e.g. a group) to a tenant and a
    role; the first rule, by position, whose value the user's claim holds decides (docs/sign-in.md)."""

    position = models.PositiveIntegerField(default=0)
    claim_value = models.CharField(max_length=200, unique=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="signin_rules")
    role = models.CharField(max_length=16, choices=User.Role.choices, default=User.Role.MEMBER)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(role="member") | models.Q(tenant__isnull=False), name="signin_member_has_tenant"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.claim_value} → {self.tenant or 'all tenants'} ({self.role})"


class ReportToken(models.Model):
    """A personal access token for the report API (read-only, its user's scope): shown once at
    creation; only its SHA-256 digest is stored. It never authorizes the OpenAI API."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="report_tokens")
    label = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"fgr_{self.prefix}… ({self.user.username})"
