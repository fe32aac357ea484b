"""Issue 49's cards a member can trust: one piece of work, one card (a batch's lines are never
also an untagged job), each line counted once under its true state, failures listed with their
reasons in words (each naming the request to follow), and the batch's description shown."""

from __future__ import annotations

from decimal import Decimal

from asgiref.sync import async_to_sync, sync_to_async

from batches.models import Batch, BatchLine
from batches.service import batch_id_new, batch_of_line
from console.live.db import batches_for
from console.live.jobs import JobMoney, batch_forecasts, job_cards, job_tallies
from console.live.snapshot import request_card
from gateway.lifecycle import job_of
from tests.integration.batches.test_claims import _batch
from tests.integration.console.conftest import A
from tests.integration.console.test_publisher import _admit as admit
from tests.integration.console.test_publisher import _dispatcher, _one_slot_config

State = BatchLine.State


def _admit(d, rid: str, *, job: str | None):
    return admit(d, A, rid, "BATCH", job=job_of(tagged=job, key_prefix="abcd1234", cls="BATCH"))


def test_a_line_id_names_its_batch_and_nothing_else_does():
    batch_id = batch_id_new()
    assert batch_of_line(f"{batch_id}.7") == batch_of_line(f"{batch_id}.7~2") == batch_id
    assert batch_of_line("req_0123") is None and batch_of_line("batch_report.7") is None
    assert batch_of_line(f"{batch_id}") is None


def test_batch_lines_are_not_an_untagged_job_and_failures_have_reasons(world):
    config = _one_slot_config()
    batch_id = batch_id_new()

    async def scenario():
        d = _dispatcher(config)
        lines = [_admit(d, f"{batch_id}.{n}", job=None) for n in range(1, 4)]  # as the feeder admits them
        tagged = [_admit(d, f"t{n}", job="report-9") for n in range(4)]
        _admit(d, "loose", job=None)
        outcomes = ["cancelled", "queue_timeout", "cancelled", "cancelled", "queue_timeout"]
        for outcome in outcomes:  # the running one ends each time: the batch's lines first, then the job's
            running = next(e for e in lines + tagged if e.state == "running")
            d.end(running, outcome)
        tallies = job_tallies(d, A, d.now_ms())
        assert set(tallies) == {"report-9", "key/abcd1234/BATCH"}
        untagged = tallies["key/abcd1234/BATCH"]
        assert (untagged.total, untagged.waiting + untagged.running, untagged.failed) == (1, 1, 0)  # "loose" alone
        every_id = {i for t in tallies.values() for i in t.done_ids + t.failed_ids + t.live_ids}
        assert not {e.public_id for e in lines} & every_id

        cards = {
            c["job"]: c for c in await sync_to_async(job_cards)(tallies, tenant_id=world[A].pk, slug=A, memo=JobMoney())
        }
        job = cards["report-9"]
        ended_here = [e for e in tagged if e.state not in ("queued", "running")]
        assert job["failed"] == len(ended_here) == sum(r["count"] for r in job["failed_by_reason"]) == 2
        assert {r["reason"] for r in job["failed_by_reason"]} == {"cancelled", "queue_timeout"}
        assert {f["id"] for f in job["failures"]} == {e.public_id for e in ended_here}
        for failure in job["failures"]:
            assert failure["because"] and "_" not in failure["because"]  # words, not a code
        assert any(r["because"].startswith("the client gave up") for r in job["failed_by_reason"])

        gave_up = next(e for e in lines + tagged if e.state == "cancelled")
        card = request_card(d, A, gave_up.public_id)  # "Follow one request" on a finished one
        assert card["state"] == "cancelled" and card["ended_because"].startswith("the client gave up")
        await d.close()

    async_to_sync(scenario)()


def test_a_batch_card_counts_each_line_once_and_says_why_lines_failed(world):
    batch = _batch(world[A], 7)
    Batch.objects.filter(pk=batch.pk).update(metadata={"description": "Nightly ticket summaries"}, status="cancelled")
    pks = list(batch.lines.order_by("number").values_list("pk", flat=True))
    BatchLine.objects.filter(pk=pks[0]).update(state=State.COMPLETED, charge=Decimal("0.054522"))
    BatchLine.objects.filter(pk=pks[1]).update(state=State.FAILED, error={"code": "upstream_error", "message": "502"})
    BatchLine.objects.filter(pk__in=pks[2:5]).update(state=State.CANCELLED, error={"code": "batch_cancelled"})
    BatchLine.objects.filter(pk=pks[5]).update(state=State.EXPIRED, error={"code": "batch_expired"})
    BatchLine.objects.filter(pk=pks[6]).update(state=State.FAILED, error={"code": "budget_exhausted"})
    Batch.objects.filter(pk=batch.pk).update(finalizing_at=batch.created_at)
    (card,) = batches_for([world[A].pk])[world[A].pk]
    counted = (card["completed"], card["failed"], card["cancelled"], card["expired"], card["running"], card["waiting"])
    assert counted == (1, 2, 3, 1, 0, 0) and sum(counted) == card["total"] == 7  # each line once
    assert card["description"] == "Nightly ticket summaries"
    reasons = {r["reason"]: r for r in card["failed_by_reason"]}
    assert set(reasons) == {"upstream_error", "budget_exhausted", "batch_expired"}  # a cancel is not a failure
    assert reasons["budget_exhausted"]["because"].startswith("budget exhausted")
    assert reasons["upstream_error"]["because"].startswith("upstream error")
    assert {f["id"] for f in card["failures"]} == {f"{batch.id}.{n}" for n in (2, 6, 7)}


def test_the_page_shows_the_description_and_amounts_in_the_currency(member_a, world):
    batch = _batch(world[A], 2)
    Batch.objects.filter(pk=batch.pk).update(metadata={"description": "Quarterly <report>"})
    page = member_a.client.get("/console/queue/").content.decode()
    assert "Quarterly \\u003Creport\\u003E" in page  # in the cards' JSON, escaped
    assert 'data-currency="USD"' in page and "USD " in page  # the budget, formatted on the server
    assert "60000.000000" not in page


def test_a_batch_card_carries_the_engines_word_on_its_last_waiting_line(world):
    config = _one_slot_config()
    batch_id = batch_id_new()

    async def scenario():
        d = _dispatcher(config)
        lines = [_admit(d, f"{batch_id}.{n}", job=None) for n in range(1, 4)]  # one running, two waiting
        _admit(d, "loose", job=None)  # not a batch's line: no forecast of its own
        now_ms = d.now_ms()
        forecasts = batch_forecasts(d, A, now_ms)
        assert set(forecasts) == {batch_id}
        last = d.live_view(lines[-1], now_ms)  # the batch's line served last
        assert forecasts[batch_id]["eta_ms"] == last["eta_ms"]
        assert forecasts[batch_id]["eta_confidence"] == last["eta_confidence"] == "prior"  # no BATCH completion yet
        await d.close()

    async_to_sync(scenario)()
