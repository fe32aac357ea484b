from django.contrib import admin

from audit.admin import AuditedAdmin
from tenants.models import Tenant


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    """A tenant's weight, budget and classes are configuration: every change is audited."""

    audit_entity = "tenant"
    list_display = ("slug", "name", "quota_share", "annual_budget", "allowed_classes", "vip", "active")
    list_filter = ("vip", "active")
    search_fields = ("slug", "name")
