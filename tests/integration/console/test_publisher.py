"""The publisher against a real dispatcher and engine: one coalesced message per changed tenant
per tick, each tenant's data to its own group only, events folded in, operations for admins."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer

from console.live.groups import ADMIN_GROUP, FINANCE_GROUP, tenant_group
from console.live.publisher import Publisher
from console.live.timeline import Sample, Timeline, p95_ms
from gateway.dispatcher import Dispatcher
from scheduling.engine.model import Request
from scheduling.selectors import config_live
from tests.integration.console.conftest import A, B


def _one_slot_config():
    config = config_live()
    return replace(config, backends=tuple(replace(b, slots=1, reserved_slots=0) for b in config.backends))


def _dispatcher(config) -> Dispatcher:
    return Dispatcher(config, audit_pk=None, loop=asyncio.get_running_loop())


def _admit(d: Dispatcher, tenant: str, rid: str, cls: str = "BATCH", *, job: str | None = None):
    request = Request(
        id=f"{tenant}/{rid}",
        tenant=tenant,
        cls=cls,
        model="sim-llama",
        prompt_tokens=10,
        expected_output_tokens=10,
        enqueued_ms=d.now_ms(),
        job=job,
    )
    return d.admit_now(request, public_id=rid, declared_class=cls, rule=None)


async def _drain(layer: InMemoryChannelLayer, channel: str) -> list[dict]:
    out = []
    while True:
        try:
            message = await asyncio.wait_for(layer.receive(channel), 0.05)
        except TimeoutError:
            return out
        out.append({**message, "payload": json.loads(message["text"])})


async def _listen(layer, group: str) -> str:
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


async def _publisher_for_a_and_b(layer, world, *, watched: tuple[str, ...]):
    """A publisher on ``layer``, a listener on each of A's and B's groups, ``watched`` open in a socket."""
    publisher = Publisher(layer=layer)
    chan_a, chan_b = await _listen(layer, tenant_group(world[A].pk)), await _listen(layer, tenant_group(world[B].pk))
    for slug in watched:
        publisher.watch(world[slug].pk)
    return publisher, chan_a, chan_b


def test_one_message_per_changed_tenant_per_tick_and_only_its_own_rows(world):
    config = _one_slot_config()

    async def scenario():
        layer = InMemoryChannelLayer()
        d = _dispatcher(config)
        publisher, chan_a, chan_b = await _publisher_for_a_and_b(layer, world, watched=(A, B))
        entries = [_admit(d, A, f"a{i}") for i in range(3)] + [_admit(d, B, f"b{i}") for i in range(2)]
        await publisher.tick(d, 1_000)
        got_a, got_b = await _drain(layer, chan_a), await _drain(layer, chan_b)
        assert len(got_a) == 1 and len(got_b) == 1
        rows_a = got_a[0]["payload"]["queue"]["rows"]
        assert {r["id"] for r in rows_a} == {"a0", "a1", "a2"} and got_a[0]["ids"] == [r["id"] for r in rows_a]
        assert {r["id"] for r in got_b[0]["payload"]["queue"]["rows"]} == {"b0", "b1"}
        assert all(r["estimated_charge"] is None for r in rows_a)  # no holds in this test

        await publisher.tick(d, 1_300)  # nothing changed: nothing sent
        assert await _drain(layer, chan_a) == [] and await _drain(layer, chan_b) == []

        running = next(e for e in entries if e.state == "running")
        for i in range(20):  # a burst of changes between two ticks
            _admit(d, A, f"burst{i}")
        d.end(running, "completed", prompt_tokens=10, output_tokens=10, served=True)
        await publisher.tick(d, 1_600)
        burst = await _drain(layer, chan_a)
        assert len(burst) == 1 and burst[0]["payload"]["queue"]["total"] == 22
        positions = [r["position"] for r in burst[0]["payload"]["queue"]["rows"] if r["state"] == "queued"]
        assert positions == sorted(positions) and positions[0] >= 1 and len(set(positions)) == len(positions)
        await d.close()

    async_to_sync(scenario)()


def test_events_ride_with_the_snapshot_and_bring_the_budget(world):
    config = _one_slot_config()

    async def scenario():
        layer = InMemoryChannelLayer()
        d = _dispatcher(config)
        publisher, chan_a, chan_b = await _publisher_for_a_and_b(layer, world, watched=(A,))
        chan_f = await _listen(layer, FINANCE_GROUP)
        await publisher.tick(d, 1_000)  # learn nothing yet
        publisher.tenant_ids[A], publisher.slugs[world[A].pk] = world[A].pk, A
        publisher.add_event(
            {"kind": "charges", "tenant_id": world[A].pk, "row": {"request_id": f"{A}/paid-1", "amount": "0.1"}}
        )
        await publisher.tick(d, 4_000)
        [message] = await _drain(layer, chan_a)
        payload = message["payload"]
        assert payload["charges"] == [{"request_id": "paid-1", "amount": "0.1"}]
        assert payload["budget"]["spent"] is not None and "queue" not in payload
        assert await _drain(layer, chan_b) == []
        assert [m["payload"]["tenants"] for m in await _drain(layer, chan_f)] == [[A]]
        await d.close()

    async_to_sync(scenario)()


def test_a_tenant_nobody_watches_gets_nothing_until_a_socket_watches_it(world):
    config = _one_slot_config()

    async def scenario():
        layer = InMemoryChannelLayer()
        d = _dispatcher(config)
        publisher, chan_a, chan_b = await _publisher_for_a_and_b(layer, world, watched=(A,))
        _admit(d, A, "a0")
        _admit(d, B, "b0")
        publisher.add_event(
            {"kind": "charges", "tenant_id": world[B].pk, "row": {"request_id": f"{B}/x", "amount": "1"}}
        )
        await publisher.tick(d, 1_000)
        assert len(await _drain(layer, chan_a)) == 1
        assert await _drain(layer, chan_b) == [] and world[B].pk not in publisher.pending

        publisher.watch(world[B].pk)  # a page opens: its table (and budget) from the next tick
        await publisher.tick(d, 4_000)
        [opened] = await _drain(layer, chan_b)
        assert [r["id"] for r in opened["payload"]["queue"]["rows"]] == ["b0"] and "budget" in opened["payload"]
        assert "charges" not in opened["payload"]  # dropped while nobody watched (the page reads them itself)

        publisher.unwatch(world[B].pk)
        _admit(d, B, "b1")
        await publisher.tick(d, 4_300)
        assert await _drain(layer, chan_b) == [] and world[B].pk not in publisher.watched
        await d.close()

    async_to_sync(scenario)()


def test_admins_get_operations_and_a_timeline(world):
    config = _one_slot_config()

    async def scenario():
        layer = InMemoryChannelLayer()
        d = _dispatcher(config)
        publisher = Publisher(layer=layer, ops_ms=2_000, sample_ms=5_000)
        chan = await _listen(layer, ADMIN_GROUP)
        _admit(d, A, "x1", cls="INTERACTIVE")
        _admit(d, A, "x2")
        await publisher.tick(d, 10_000)
        await publisher.tick(d, 10_300)  # within ops_ms: no second ops message
        [ops] = await _drain(layer, chan)
        payload = ops["payload"]
        classes = {c["class"]: c for c in payload["classes"]}
        assert payload["in_queue"] == 1 and classes["BATCH"]["depth"] == 1
        assert {b["backend"]: b["in_use"] for b in payload["backends"]} == {"sim-gpu": 1}
        assert len(payload["timeline"]) == 1 and payload["timeline"][0]["in_queue"] == 1
        assert publisher.ops_text and json.loads(publisher.ops_text)["type"] == "ops"
        await d.close()

    async_to_sync(scenario)()


def test_p95_and_ring_buffer():
    buckets = (100, 250, 500)
    assert p95_ms([0, 0, 0, 0], buckets) is None
    assert p95_ms([94, 0, 6, 0], buckets) == 500
    assert p95_ms([96, 4, 0, 0], buckets) == 100
    assert p95_ms([0, 0, 0, 5], buckets) == 500  # the open bucket answers its lower bound
    timeline = Timeline(step_ms=1_000, span_ms=3_000)
    for t in range(5):
        timeline.add(Sample(at_ms=t, in_queue=t, interactive_p95_ms=None, batch_completed=0, aging_preempts=0))
    assert [row["at_ms"] for row in timeline.as_rows()] == [2, 3, 4]
