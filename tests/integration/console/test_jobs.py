"""A member's requests as jobs, against a real dispatcher and engine: grouped by X-Job-Id (untagged
by key and class), progress from live and finished requests, the ETA to the last one, charges from
the ledger; the queue table pages with every row reachable and positions explained."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer

from console.live.jobs import JobMoney, job_cards, job_label, job_tallies, waits_by_minute
from console.live.snapshot import tenant_queue
from gateway.lifecycle import job_of
from tests.integration.console.conftest import A, B
from tests.integration.console.test_publisher import _admit as admit
from tests.integration.console.test_publisher import _dispatcher, _drain, _one_slot_config, _publisher_for_a_and_b


def _admit(d, tenant: str, rid: str, *, job: str | None, cls: str = "BATCH"):
    return admit(d, tenant, rid, cls, job=job_of(tagged=job, key_prefix="abcd1234", cls=cls))


def test_requests_group_as_jobs_with_progress_eta_and_pages(world):
    config = _one_slot_config()

    async def scenario():
        d = _dispatcher(config)
        entries = [_admit(d, A, f"r{i}", job="report-7") for i in range(6)]
        _admit(d, A, "loose", job=None)
        _admit(d, B, "theirs", job="report-7")  # another tenant's job of the same name stays theirs
        running = next(e for e in entries if e.state == "running")
        d.end(running, "completed", prompt_tokens=10, output_tokens=10, served=True)
        failing = next(e for e in entries if e.state == "running")
        d.end(failing, "upstream_error")
        now_ms = d.now_ms()
        tallies = job_tallies(d, A, now_ms)
        assert set(tallies) == {"report-7", "key/abcd1234/BATCH"}
        report = tallies["report-7"]
        assert (len(report.done_ids), report.failed, report.running, report.waiting) == (1, 1, 1, 3)
        assert report.total == 6 and report.eta_ms is not None and report.eta_ms > 0
        assert job_label("key/abcd1234/BATCH") == ("Untagged · key abcd1234… · BATCH", False)

        cards = await sync_to_async(job_cards)(tallies, tenant_id=world[A].pk, slug=A, memo=JobMoney())
        assert [c["job"] for c in cards] == ["report-7", "key/abcd1234/BATCH"]  # tagged first
        assert cards[0]["charged"] == "0" and cards[0]["estimate_basis"] == "mean so far"  # no ledger here
        # the job's ETA is its last request's, with the same fields as the queue API's
        last = d.live_view(report.last_waiting, now_ms)
        card = cards[0]
        assert card["eta_ms"] == last["eta_ms"] <= card["eta_upper_ms"] <= 2 * card["eta_ms"]
        assert (card["eta_upper_ms"], card["eta_confidence"]) == (last["eta_upper_ms"], last["eta_confidence"])
        assert card["eta_confidence"] == "measured" and card["eta_slip_reason"] is None  # one has completed
        assert card["eta_first_at_ms"] == last["eta_first_at_ms"] is not None

        first = tenant_queue(d, A, now_ms, limit=2)
        second = tenant_queue(d, A, now_ms, offset=2, limit=2)
        third = tenant_queue(d, A, now_ms, offset=4, limit=2)
        ids = [r["id"] for q in (first, second, third) for r in q["rows"]]
        assert sorted(ids) == sorted([e.public_id for e in entries[2:]] + ["loose"])  # every live row, once
        ranks = [r["of_yours"] for q in (first, second, third) for r in q["rows"] if r["state"] == "queued"]
        assert ranks == [1, 2, 3, 4]  # the tenant's own BATCH requests, in order
        assert first["truncated"] and third["truncated"]
        assert {r["minute"][:2] for r in waits_by_minute(d, A, now_ms)} == {"20"}
        await d.close()

    async_to_sync(scenario)()


def test_the_publisher_pushes_job_cards_to_their_tenant_only(world):
    config = _one_slot_config()

    async def scenario():
        layer = InMemoryChannelLayer()
        d = _dispatcher(config)
        publisher, chan_a, chan_b = await _publisher_for_a_and_b(layer, world, watched=(A, B))
        _admit(d, A, "a0", job="nightly")
        await publisher.tick(d, 1_000)
        [message] = await _drain(layer, chan_a)
        assert [c["job"] for c in message["payload"]["jobs"]] == ["nightly"]
        assert all("jobs" not in m["payload"] for m in await _drain(layer, chan_b))
        await publisher.tick(d, 1_300)  # within the second: no cards again
        assert all("jobs" not in m["payload"] for m in await _drain(layer, chan_a))
        assert json.dumps(message["payload"]["jobs"])  # plain JSON
        await d.close()

    async_to_sync(scenario)()


@pytest.mark.redis
def test_with_the_shared_scheduler_another_process_s_requests_join_their_job(settings):
    """A request submitted through another gateway process reaches this one only through the
    replica of the shared engine: its job travels in the submit command."""
    from gateway.shared import SharedDispatcher
    from scheduling.shared.protocol import Routes, Step, submit
    from scheduling.shared.replica import engine_of
    from tests.integration.scheduling.test_shared_differential import _config

    settings.FAIRGATE_SHARED_PREFIX = "test:console-jobs"
    cfg = _config()

    async def run() -> None:
        d = SharedDispatcher(cfg, audit_pk=None, loop=asyncio.get_running_loop())
        try:
            replica = engine_of(cfg)
            d.owner.sched = replica
            step = Step(replica, Routes(), d.now_ms(), cfg.backends)
            for i in range(3):  # the other process's: one runs (g1 has slots), as the dispatcher would
                step.apply(
                    [
                        submit(
                            "gw2",
                            f"a/x{i}",
                            tenant="a",
                            cls="BATCH",
                            model="m",
                            prompt_tokens=5,
                            expected_output_tokens=5,
                            job="etl-42",
                        )
                    ]
                )
            step.pump()
            tallies = job_tallies(d, "a", d.now_ms())
            assert set(tallies) == {"etl-42"} and tallies["etl-42"].total == 3
            assert tallies["etl-42"].running + tallies["etl-42"].waiting == 3
        finally:
            await d.redis.aclose()

    asyncio.run(run())


def test_a_jobs_money_is_its_finished_requests_charges_and_the_mean_for_the_rest(world):
    from billing.services import budget_hold, charge_settle
    from console.live.jobs import JobTally

    for rid in ("r0", "r1", "r2"):  # r0 and r1 end charged, r2 is still held
        budget_hold(
            tenant_slug=A,
            request_id=f"{A}/{rid}",
            class_name="BATCH",
            model="sim-llama",
            prompt_tokens=100,
            max_output_tokens=50,
        )
    amounts = [
        charge_settle(request_id=f"{A}/{rid}", backend_name="sim-gpu", prompt_tokens=100, completion_tokens=40)
        for rid in ("r0", "r1")
    ]
    memo = JobMoney()
    tally = JobTally("j", done_ids=["r0"], failed_ids=["r1"], waiting=2, live_ids=["r2", "r3"])
    [card] = job_cards({"j": tally}, tenant_id=world[A].pk, slug=A, memo=memo)
    charged = sum(amounts)
    assert card["charged"] == str(charged) and card["done"] == 1 and card["failed"] == 1
    assert card["estimated_total"] == str(charged * 2) and card["estimate_basis"] == "mean so far"
    assert job_cards({"j": tally}, tenant_id=world[B].pk, slug=A, memo=JobMoney())[0]["charged"] == "0"  # not B's
    first = JobTally("k", waiting=2, live_ids=["r2", "r3"])  # nothing ended: the held amount bounds it
    [bound] = job_cards({"k": first}, tenant_id=world[A].pk, slug=A, memo=memo)
    assert bound["estimate_basis"] == "holds (at most)" and Decimal(bound["estimated_total"]) > 0
