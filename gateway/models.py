"""The gateway's own records: downgrade events (identity is the tenants app)."""

from __future__ import annotations

from django.db import models

from tenants.models import Tenant


class DowngradeEvent(models.Model):
    """A request's class lowered at the gateway: by the tenant's allowed classes (rule
    ``undeclared``) or by a downgrade rule. Written off the request's critical path."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="downgrades")
    request_id = models.CharField(max_length=128)
    from_class = models.CharField(max_length=32)
    to_class = models.CharField(max_length=32)
    rule = models.CharField(max_length=64)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["tenant", "at"]), models.Index(fields=["rule", "at"])]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.request_id}: {self.from_class} → {self.to_class} ({self.rule})"
