from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.admin import AuditedAdmin
from audit.services import audit_record
from scheduling.models import (
    AgingSegment,
    Backend,
    DowngradeRule,
    NetworkGroup,
    PriceVersion,
    PriorityClass,
    SchedulerPolicy,
)
from scheduling.prices import ConfirmNeeded, backend_prices_check, price_factor_check
from scheduling.upstreams import backend_upstream_check


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


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    audit_entity = "class"
    list_display = ("name", "level", "sla_ms", "active", "updated_at")
    list_filter = ("active",)
    search_fields = ("name",)
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


@admin.register(SchedulerPolicy)
class SchedulerPolicyAdmin(AuditedAdmin):
    audit_entity = "policy"
    list_display = ("policy", "aging_mode", "fairness_mode", "min_share", "updated_at")


@admin.register(AgingSegment)
class AgingSegmentAdmin(AuditedAdmin):
    audit_entity = "aging"
    list_display = ("position", "wait_ratio_lo", "wait_ratio_hi", "boost", "k")


@admin.register(NetworkGroup)
class NetworkGroupAdmin(AuditedAdmin):
    audit_entity = "network"
    list_display = ("name", "cidrs", "active")
    list_filter = ("active",)
    search_fields = ("name",)


@admin.register(DowngradeRule)
class DowngradeRuleAdmin(AuditedAdmin):
    audit_entity = "rule"
    list_display = ("order", "name", "condition", "action", "enabled", "active")
    list_filter = ("enabled", "active", "action")
    search_fields = ("name", "condition")


class BackendForm(forms.ModelForm):
    class Meta:
        model = Backend
        fields = ("name", "input_price_per_1k", "output_price_per_1k")  # the admin adds the others

    def clean(self):
        super().clean()
        cleaned = self.cleaned_data
        prices = (cleaned.get("input_price_per_1k"), cleaned.get("output_price_per_1k"))
        if None not in prices:
            try:
                backend_prices_check(
                    name=cleaned.get("name") or "", input_price_per_1k=prices[0], output_price_per_1k=prices[1]
                )
            except ValidationError as refused:
                raise forms.ValidationError(refused.messages) from None
        upstream = {key: cleaned.get(key) or None for key in ("api_key_env", "headers", "dialect", "deployment")}
        try:
            backend_upstream_check(
                name=cleaned.get("name") or "", raw={**upstream, "api_version": cleaned.get("api_version") or None}
            )
        except ValidationError as refused:
            raise forms.ValidationError(refused.messages) from None
        return cleaned


@admin.register(Backend)
class BackendAdmin(AuditedAdmin):
    audit_entity = "backend"
    form = BackendForm
    list_display = (
        "name",
        "url",
        "slots",
        "reserved_slots",
        "tpm",
        "rpm",
        "input_price_per_1k",
        "output_price_per_1k",
        "fallback_for",
        "api_key_env",
        "dialect",
        "enabled",
    )
    list_filter = ("enabled",)
    search_fields = ("name", "url")
