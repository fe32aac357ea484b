"""Revoking a key and cancelling a batch in the console ask first, and say what stops."""

from __future__ import annotations

from batches.models import Batch, BatchLine
from tenants.models import ApiKey
from tests.integration.batches.test_claims import _batch as made_batch
from tests.integration.console.conftest import A


def _batch(tenant, prefix: str, lines: int) -> Batch:
    """``lines`` lines of a batch made with key ``prefix``: the first running, the rest waiting."""
    batch = made_batch(tenant, lines)
    Batch.objects.filter(pk=batch.pk).update(key_prefix=prefix)
    first = batch.lines.order_by("number").first()
    BatchLine.objects.filter(pk=first.pk).update(state=BatchLine.State.SENT)
    return batch


def test_revoking_a_key_names_its_open_batches_first(member_a, world):
    member_a.client.post("/console/keys/create/", {"label": "k", "default_class": "BATCH"})
    key = ApiKey.objects.get(label="k")
    batch = _batch(world[A], key.prefix, 4)
    asked = member_a.client.post(f"/console/keys/{key.prefix}/revoke/")
    assert asked.status_code == 200
    text = asked.content.decode()
    assert "refused (401 invalid_api_key)" in text and f"Batch {batch.id}: its 3 waiting lines fail" in text
    key.refresh_from_db()
    assert key.is_active  # nothing happened yet
    member_a.client.post(f"/console/keys/{key.prefix}/revoke/", {"confirm": "yes"})
    key.refresh_from_db()
    assert not key.is_active


def test_cancelling_a_batch_says_what_stops_first(member_a, world):
    batch = _batch(world[A], "0123456789", 5)
    asked = member_a.client.post(f"/console/batches/{batch.id}/cancel/")
    assert asked.status_code == 200
    text = asked.content.decode()
    assert "Its 4 waiting lines never start" in text and "Its 1 running lines finish" in text
    assert Batch.objects.get(pk=batch.pk).status == Batch.Status.IN_PROGRESS
    member_a.client.post(f"/console/batches/{batch.id}/cancel/", {"confirm": "yes"})
    assert Batch.objects.get(pk=batch.pk).status == Batch.Status.CANCELLING


def test_rotating_a_key_asks_then_shows_the_new_one_once(member_a, world):
    member_a.client.post("/console/keys/create/", {"label": "rot", "default_class": "BATCH", "expires_days": "30"})
    old = ApiKey.objects.get(label="rot")
    assert old.expires_at is not None
    asked = member_a.client.post(f"/console/keys/{old.prefix}/rotate/").content.decode()
    assert "keeps working for 24 h more" in asked and ApiKey.objects.filter(label="rot").count() == 1
    shown = member_a.client.post(f"/console/keys/{old.prefix}/rotate/", {"confirm": "yes"}).content.decode()
    new = ApiKey.objects.get(label="rot", replaced_by=None)
    assert f"fg_{new.prefix}_" in shown and 'id="rotated"' in shown and old.prefix in shown
    page = member_a.client.get("/console/queue/").content.decode()
    assert f"fg_{new.prefix}_" not in page and "rotated" in page


def test_a_long_key_label_is_refused_with_a_message(member_a):
    page = member_a.client.post(
        "/console/keys/create/", {"label": "x" * 201, "default_class": "BATCH"}, follow=True
    ).content.decode()
    assert "at most 200 characters" in page
    assert not ApiKey.objects.filter(label__startswith="xxx").exists()
