"""Start-up checks of the Batch API (shown by `manage.py serve`, `check` and `migrate`)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks


@checks.register()
def local_files_with_shared_scheduler(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """Gateways sharing one scheduler may run on several machines; each machine's var/files then
    holds only its own uploads. Silence with SILENCED_SYSTEM_CHECKS once all run on one machine."""
    if settings.FAIRGATE_SCHEDULER != "shared" or not settings.FAIRGATE_FILES_STORAGE.endswith("FileSystemStorage"):
        return []
    return [
        checks.Warning(
            "the shared scheduler is on and Batch API files are kept on this machine's disk (var/files)",
            hint="fine while every gateway and worker runs on this machine; across machines set "
            "FAIRGATE_FILES_STORAGE to a shared storage (storages.backends.s3.S3Storage of django-storages)",
            id="batches.W001",
        )
    ]
