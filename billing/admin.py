"""Admin: budgets, ledger and alerts are read-only (the ledger is append-only; corrections are
`ledger_adjust`); a tenant's billing settings are editable and audited."""

from django.contrib import admin

from audit.admin import AuditedAdmin, ReadOnlyAdmin
from billing.models import Budget, BudgetAlert, LedgerEntry, TenantBilling


@admin.register(TenantBilling)
class TenantBillingAdmin(AuditedAdmin):
    audit_entity = "tenant_billing"
    list_display = ("tenant", "monthly_cap", "fallback_on_exhausted", "webhook_url", "alert_emails")


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "kind", "fiscal_year", "starts_at", "limit", "spent", "held")
    list_filter = ("kind", "fiscal_year", "tenant")


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "kind", "tenant", "request_id", "class_name", "amount", "unbilled", "reason", "author")
    list_filter = ("kind", "class_name", "tenant")
    search_fields = ("request_id", "reason", "author")
    date_hierarchy = "at"


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "budget",
        "threshold_pct",
        "spent",
        "limit",
        "webhook_delivered_at",
        "email_delivered_at",
        "delivery_error",
    )
