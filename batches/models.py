"""Files of the Batch API: one row per stored file, its bytes in the files storage (batches.files)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class BatchFile(models.Model):
    """A file a tenant uploaded (``purpose`` batch) or a batch wrote (batch_output). ``id`` is the
    public one (``file-…``, in time order); the bytes are ``storage_name`` in the files storage."""

    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="batch_files")
    purpose = models.CharField(max_length=32, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField()
    lines = models.PositiveIntegerField()
    storage_name = models.CharField(max_length=400)
    created_at = models.DateTimeField(default=timezone.now)
    key_prefix = models.CharField(max_length=32, blank=True)  # the API key that uploaded it

    class Meta:
        indexes = [models.Index(fields=["tenant", "id"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"
