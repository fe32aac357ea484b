"""Admin: budgets, ledger and alerts are read-only (the ledger is append-only; corrections are
`ledger_adjust`); a tenant's billing settings are editable and audited; a class's price versions
are added (never edited) inline on scheduling's class page."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.admin import AuditedAdmin, ReadOnlyAdmin
from audit.services import audit_record
from billing.alerts import alert_deliver
from billing.models import Budget, BudgetAlert, LedgerEntry, PriceVersion, TenantBilling
from scheduling.admin import PriorityClassAdmin
from scheduling.models import PriorityClass
from scheduling.prices import ConfirmNeeded, price_factor_check


@admin.register(TenantBilling)
class TenantBillingAdmin(AuditedAdmin):
    audit_entity = "tenant_billing"
    list_display = ("tenant", "monthly_cap", "fallback_on_exhausted", "webhook_url", "webhook_format", "alert_emails")


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "kind", "fiscal_year", "starts_at", "limit", "spent", "held")
    list_filter = ("kind", "fiscal_year", "tenant")


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "at",
        "kind",
        "tenant",
        "request_id",
        "class_name",
        "amount",
        "unbilled",
        "key_prefix",
        "job_id",
        "reason",
        "author",
    )
    list_filter = ("kind", "class_name", "tenant")
    search_fields = ("request_id", "reason", "author", "key_prefix", "job_id", "key_creator")
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
        "delivery_attempts",
        "delivery_error",
    )
    actions = ["deliver_again"]

    @admin.action(description="Try the delivery again now (after fixing the endpoint)")
    def deliver_again(self, request, queryset) -> None:
        for alert in queryset:
            BudgetAlert.objects.filter(pk=alert.pk).update(delivery_attempts=0, last_attempt_at=None)
            alert_deliver.delay(alert.pk)
        self.message_user(request, f"{queryset.count()} alert(s) sent for delivery again.")


class PriceVersionForm(forms.ModelForm):
    """A new version, refused as every door refuses (scheduling.prices); effective at: empty is now."""

    confirm = forms.BooleanField(required=False, help_text="Needed for a factor moved more than 2x.")

    class Meta:
        model = PriceVersion
        fields = ("price_factor", "effective_at")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "effective_at" in self.fields:
            self.fields["effective_at"].required = False

    def clean(self):
        super().clean()
        cleaned = self.cleaned_data
        if not self.instance._state.adding or self.errors:
            return cleaned
        now = timezone.now()
        cleaned["effective_at"] = cleaned.get("effective_at") or now
        class_name = PriorityClass.objects.filter(pk=self.instance.priority_class_id).values_list("name", flat=True)
        try:
            price_factor_check(
                class_name=class_name.first() or "",
                price_factor=cleaned.get("price_factor"),
                effective_at=cleaned["effective_at"],
                confirm=bool(cleaned.get("confirm")),
                now=now,
            )
        except ConfirmNeeded as asked:
            self.add_error("confirm", asked.message)
        except ValidationError as refused:
            raise forms.ValidationError(refused.messages) from None
        return cleaned


class PriceVersionInline(admin.TabularInline):
    model = PriceVersion
    form = PriceVersionForm
    extra = 0
    fields = ("price_factor", "effective_at", "confirm", "created_by", "created_at")
    readonly_fields = ("created_by", "created_at")
    can_delete = False

    def has_change_permission(self, request, obj=None):
        return False  # a price change is a new version, never an edit


admin.site.unregister(PriorityClass)  # scheduling's page, registered again below with its prices


@admin.register(PriorityClass)
class PriorityClassWithPricesAdmin(PriorityClassAdmin):
    """Scheduling's class page with the class's price versions inline (billing's)."""

    inlines = [PriceVersionInline]

    def save_formset(self, request, form, formset, change):
        for version in formset.save(commit=False):
            version.created_by = request.user.get_username()
            version.save()
            audit_record(
                actor=version.created_by,
                action="price",
                entity="class",
                key=str(version.priority_class),
                field_name="price_factor",
                new=version.price_factor,
            )
