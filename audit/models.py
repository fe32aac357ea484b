"""One row per audited change of configuration (classes, prices, policy, tenants, keys, backends)."""

from __future__ import annotations

from django.db import models


class AuditLog(models.Model):
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32)  # create | update | deactivate | price
    entity = models.CharField(max_length=64)  # e.g. "class", "tenant", "backend"
    key = models.CharField(max_length=200)  # e.g. "INTERACTIVE"
    field = models.CharField(max_length=64, blank=True)
    old = models.JSONField(null=True, blank=True)
    new = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "scheduling_auditlog"  # made by scheduling.0001, before this app existed
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.entity}:{self.key} {self.field}"
