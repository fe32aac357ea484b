"""The member's batch-job cards: progress by line state, charges so far and an ETA at the batch's
own rate (batches.service.batch_cards), pushed by the publisher once a second where they changed,
shown only to the batch's tenant, and a cancel that only the tenant's own people can make."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer
from django.utils import timezone

from audit.models import AuditLog
from batches.models import Batch, BatchLine
from batches.service import batch_cards
from tests.integration.batches.test_claims import _batch
from tests.integration.console.conftest import A, B
from tests.integration.console.test_publisher import _dispatcher, _drain, _one_slot_config, _publisher_for_a_and_b

State = BatchLine.State


def _progress(batch: Batch, *, completed: int, failed: int, sent: int, minutes_ago: int = 10) -> None:
    """Moves the batch's first lines on (as workers would) and dates it ``minutes_ago``."""
    pks = list(batch.lines.order_by("number").values_list("pk", flat=True))
    BatchLine.objects.filter(pk__in=pks[:completed]).update(state=State.COMPLETED, charge=Decimal("0.25"))
    BatchLine.objects.filter(pk__in=pks[completed : completed + failed]).update(state=State.FAILED)
    BatchLine.objects.filter(pk__in=pks[completed + failed : completed + failed + sent]).update(state=State.SENT)
    Batch.objects.filter(pk=batch.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))


def test_a_card_counts_lines_by_state_sums_charges_and_projects_its_rate(world):
    batch = _batch(world[A], 20)
    Batch.objects.filter(pk=batch.pk).update(forecast={"cost_bound": "9.5", "done_in_s": 600, "fits_window": True})
    _progress(batch, completed=4, failed=1, sent=2)
    (card,) = batch_cards([world[A].pk])[world[A].pk]
    assert (card["total"], card["completed"], card["failed"], card["running"], card["waiting"]) == (20, 4, 1, 2, 13)
    assert Decimal(card["charged"]) == Decimal("1.00") and card["cost_bound"] == "9.5"
    assert abs(card["eta_s"] - 15 * 600 / 5) <= 2  # 5 ended in 10 min: the other 15 at that rate
    assert card["cancellable"] and card["fits_window"] is True
    assert world[B].pk not in batch_cards([world[B].pk])  # another tenant's batch is not its


def test_before_its_first_line_ends_the_eta_is_the_forecast_less_the_time_gone(world):
    batch = _batch(world[A], 5)
    Batch.objects.filter(pk=batch.pk).update(forecast={"done_in_s": 900})
    _progress(batch, completed=0, failed=0, sent=1, minutes_ago=5)
    (card,) = batch_cards([world[A].pk])[world[A].pk]
    assert abs(card["eta_s"] - 600) <= 2


def test_the_publisher_pushes_cards_where_they_changed_and_to_their_tenant_only(world):
    batch = _batch(world[A], 3)
    config = _one_slot_config()

    async def scenario():
        layer = InMemoryChannelLayer()
        d = _dispatcher(config)
        publisher, chan_a, chan_b = await _publisher_for_a_and_b(layer, world, watched=(A, B))
        await publisher.tick(d, 10_000)
        sent = [m["payload"] for m in await _drain(layer, chan_a) if "batches" in m["payload"]]
        assert [[c["id"] for c in p["batches"]] for p in sent] == [[batch.id]]
        assert not [m for m in await _drain(layer, chan_b) if "batches" in m["payload"]]
        await publisher.tick(d, 12_000)  # due again, nothing changed: nothing sent
        assert not [m for m in await _drain(layer, chan_a) if "batches" in m["payload"]]
        await _done_one(batch)
        await publisher.tick(d, 14_000)
        (changed,) = [m["payload"]["batches"] for m in await _drain(layer, chan_a) if "batches" in m["payload"]]
        assert changed[0]["completed"] == 1
        await d.close()

    async_to_sync(scenario)()


async def _done_one(batch: Batch) -> None:
    await sync_to_async(_progress)(batch, completed=1, failed=0, sent=0, minutes_ago=0)


def test_a_member_cancels_its_own_batch_and_not_another_tenants(member_a, member_b, world):
    batch = _batch(world[A], 3)
    assert member_b.client.post(f"/console/batches/{batch.id}/cancel/").status_code == 404
    assert Batch.objects.get(pk=batch.pk).status == Batch.Status.IN_PROGRESS
    response = member_a.client.post(f"/console/batches/{batch.id}/cancel/", {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == "/console/queue/"
    assert Batch.objects.get(pk=batch.pk).status == Batch.Status.CANCELLING
    assert set(batch.lines.values_list("state", flat=True)) == {State.CANCELLED}
    assert AuditLog.objects.filter(action="cancel", entity="batch", key=batch.id, new="cancelling").exists()
    page = member_a.client.get("/console/queue/")
    assert batch.id in page.content.decode()  # the card's data, rendered into the page
    api = member_a.client.get("/console/api/queue/").json()
    assert [c["id"] for c in api["batches"]] == [batch.id] and api["batches"][0]["status"] == "cancelling"
