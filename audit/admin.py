"""The audit log in Django's admin, and the two admin bases other apps build on: one that audits
every save, one for history that is never edited."""

from django.contrib import admin

from audit.models import AuditLog
from audit.services import audit_record


class AuditedAdmin(admin.ModelAdmin):
    """Every admin save writes one audit row per changed field."""

    audit_entity = ""

    def save_model(self, request, obj, form, change):
        old = type(obj).objects.filter(pk=obj.pk).first() if change else None
        super().save_model(request, obj, form, change)
        actor = request.user.get_username()
        if old is None:
            audit_record(actor=actor, action="create", entity=self.audit_entity, key=str(obj))
            return
        for name in form.changed_data:
            audit_record(
                actor=actor,
                action="update",
                entity=self.audit_entity,
                key=str(obj),
                field_name=name,
                old=getattr(old, name, None),
                new=getattr(obj, name, None),
            )


class ReadOnlyAdmin(admin.ModelAdmin):
    """For history (audit rows, ledger entries, budgets): viewable, never added, changed or deleted."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "entity", "key", "field", "old", "new")
    list_filter = ("action", "entity")
    search_fields = ("actor", "key", "field")
    date_hierarchy = "at"
