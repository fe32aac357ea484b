from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from audit.admin import AuditedAdmin
from scheduling.models import (
    AgingSegment,
    Backend,
    DowngradeRule,
    NetworkGroup,
    PriorityClass,
    SchedulerPolicy,
)
from scheduling.prices import backend_prices_check
from scheduling.upstreams import backend_upstream_check


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    audit_entity = "class"
    list_display = ("name", "level", "sla_ms", "active", "updated_at")
    list_filter = ("active",)
    search_fields = ("name",)


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
