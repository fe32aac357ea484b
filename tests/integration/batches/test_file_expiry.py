"""Files expire: an upload's expires_after (OpenAI's range) or FAIRGATE_FILE_TTL_S; one past its
time is gone for the API at once and deleted, row and bytes, by beat's sweep."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.utils import timezone

from batches import files, tasks
from batches.files import FileRefused
from batches.models import BatchFile
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "batch_files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    return Tenant.objects.create(slug="t", name="T", quota_share=0.3)


def _upload(tenant: Tenant, keep_s: int | None = None) -> BatchFile:
    stored = files.file_store(tenant_slug="t", purpose="batch", upload=ContentFile(b'{"a": 1}\n', name="j.jsonl"))
    return files.file_record(stored=stored, tenant_id=tenant.pk, key_prefix="k", purpose="batch", keep_s=keep_s)


def test_expires_after_is_read_in_openais_range_and_defaults_to_the_ttl(settings):
    assert files.expiry_of({}) == settings.FAIRGATE_FILE_TTL_S
    assert files.expiry_of({"expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"}) == 7200
    for form in (
        {"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},  # below an hour
        {"expires_after[anchor]": "created_at", "expires_after[seconds]": str(31 * 24 * 3600)},
        {"expires_after[anchor]": "last_used", "expires_after[seconds]": "7200"},
        {"expires_after[seconds]": "soon"},
    ):
        with pytest.raises(FileRefused) as refused:
            files.expiry_of(form)
        assert refused.value.status == 400 and "expires_after" in refused.value.message


def test_a_file_past_its_time_is_gone_at_once_and_deleted_by_the_sweep(tenant):
    kept, old = _upload(tenant), _upload(tenant, keep_s=3600)
    assert files.file_object(old)["expires_at"] == int(old.expires_at.timestamp())
    BatchFile.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(FileRefused):
        files.file_get(tenant_id=tenant.pk, file_id=old.id)
    assert [
        f.id for f in files.files_list(tenant_id=tenant.pk, purpose=None, after=None, limit=10, ascending=True).files
    ] == [kept.id]
    assert files.files_storage().exists(old.storage_name)
    assert tasks.sweep() == {"lines_expired": 0, "batches_finalized": 0, "files_deleted": 1}
    assert not files.files_storage().exists(old.storage_name) and not BatchFile.objects.filter(pk=old.pk).exists()
    assert files.files_storage().exists(kept.storage_name)
