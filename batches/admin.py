from django.contrib import admin

from batches.models import BatchFile


@admin.register(BatchFile)
class BatchFileAdmin(admin.ModelAdmin):
    list_display = ("id", "tenant", "purpose", "filename", "bytes", "lines", "created_at")
    list_filter = ("purpose", "tenant")
    search_fields = ("id", "filename")
    readonly_fields = [f.name for f in BatchFile._meta.fields]

    def has_add_permission(self, request) -> bool:  # files come through the API
        return False
