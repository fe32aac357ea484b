"""Users and API keys in Django's admin. The tenant's own admin page is audited, so it is
registered with the audit log's admin (gateway.admin)."""

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from tenants.models import ApiKey, User


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "prefix",
        "tenant",
        "label",
        "default_class",
        "created_at",
        "created_by",
        "revoked_at",
        "last_used_at",
    )
    list_filter = ("default_class", "tenant")
    search_fields = ("prefix", "label", "tenant__slug")
    readonly_fields = ("prefix", "secret_hash", "created_at", "created_by", "last_used_at")

    def has_add_permission(self, request):
        return False  # keys are created with `manage.py apikey create` or in the console (secret shown once)


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "tenant", "role", "is_staff", "is_active")
    list_filter = ("role", "tenant", "is_staff")
    fieldsets = (*(BaseUserAdmin.fieldsets or ()), ("Fairgate", {"fields": ("tenant", "role")}))
    add_fieldsets = (*BaseUserAdmin.add_fieldsets, ("Fairgate", {"fields": ("tenant", "role")}))
