"""Intake lanes (gateway.lanes): turns at intake go to the most urgent class waiting, first come
first served within it; the top class never waits; a full backlog is a 429 at once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.lanes import IntakeLanes

TOP, NEAR_RT, BATCH = 0, 1, 2


async def _settle() -> None:
    for _ in range(5):  # let every woken waiter run up to its next await
        await asyncio.sleep(0)


async def _queue(lanes: IntakeLanes, order: list[str], name: str, level: int) -> asyncio.Task:
    async def one() -> None:
        await lanes.enter(level=level, cls=name)
        order.append(name)

    task = asyncio.create_task(one())
    await _settle()
    return task


def test_a_freed_turn_goes_to_the_most_urgent_class_waiting_then_in_arrival_order():
    async def scenario() -> list[str]:
        lanes = IntakeLanes(concurrency=1, backlog=10)
        await lanes.enter(level=BATCH, cls="BATCH")  # the one turn is taken
        order: list[str] = []
        for name, level in [("b1", BATCH), ("b2", BATCH), ("n1", NEAR_RT), ("b3", BATCH), ("n2", NEAR_RT)]:
            await _queue(lanes, order, name, level)
        assert order == []  # all wait: the turn is taken
        for _ in range(5):
            lanes.leave()
            await _settle()
        return order

    assert asyncio.run(scenario()) == ["n1", "n2", "b1", "b2", "b3"]


def test_the_top_class_never_waits_for_a_turn():
    async def scenario() -> tuple[bool, bool]:
        lanes = IntakeLanes(concurrency=1, backlog=10)
        await lanes.enter(level=BATCH, cls="BATCH")
        async with lanes.lane(level=TOP, top_level=TOP, cls="INTERACTIVE") as in_lane:
            top_in_lane = in_lane
        waiter = asyncio.create_task(_enter_lane(lanes, NEAR_RT))
        await _settle()
        blocked = not waiter.done()
        lanes.leave()
        await _settle()
        assert waiter.done(), "the lower class never got the freed turn"
        return top_in_lane, blocked and waiter.result()

    top_in_lane, lower_waited_then_ran = asyncio.run(scenario())
    assert top_in_lane is False
    assert lower_waited_then_ran is True


async def _enter_lane(lanes: IntakeLanes, level: int) -> bool:
    async with lanes.lane(level=level, top_level=TOP, cls="X") as in_lane:
        return in_lane


def test_a_full_backlog_is_refused_at_once_with_429_queue_full_and_retry_after():
    async def scenario() -> GatewayError:
        lanes = IntakeLanes(concurrency=1, backlog=2)
        await lanes.enter(level=BATCH, cls="BATCH")
        order: list[str] = []
        await _queue(lanes, order, "b1", BATCH)
        await _queue(lanes, order, "b2", BATCH)
        await _queue(lanes, order, "n1", NEAR_RT)  # another class has a backlog of its own
        attempt = asyncio.create_task(lanes.enter(level=BATCH, cls="BATCH"))
        await _settle()
        assert attempt.done(), "a request past the backlog waited instead of being refused"
        assert lanes.waiting(BATCH) == 2 and lanes.waiting(NEAR_RT) == 1
        with pytest.raises(GatewayError) as refused:
            attempt.result()
        return refused.value

    err = asyncio.run(scenario())
    assert (err.status, err.code) == (429, "queue_full")
    assert "BATCH" in err.message
    assert err.response_headers()["Retry-After"] == "1"


def test_a_waiter_that_leaves_gives_up_its_place_and_a_turn_handed_to_it_goes_on():
    async def scenario() -> tuple[list[str], int]:
        lanes = IntakeLanes(concurrency=1, backlog=10)
        await lanes.enter(level=BATCH, cls="BATCH")
        order: list[str] = []
        gone = await _queue(lanes, order, "gone", BATCH)
        await _queue(lanes, order, "next", BATCH)
        gone.cancel()  # its client left while it waited
        await _settle()
        lanes.leave()  # the turn skips it
        await _settle()
        handed = await _queue(lanes, order, "handed", BATCH)
        lanes.leave()  # "next" gives its turn back (it entered without the context manager)
        handed.cancel()  # cancelled in the same turn as it was handed the turn: it passes it on
        await _settle()
        return order, lanes.busy

    order, busy = asyncio.run(scenario())
    assert order == ["next"]
    assert busy == 0


@settings(max_examples=150, deadline=None)
@given(
    concurrency=st.integers(1, 3),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("enter"), st.integers(1, 3)),
            st.tuples(st.just("leave"), st.just(0)),
            st.tuples(st.just("cancel"), st.integers(0, 20)),
        ),
        max_size=40,
    ),
)
def test_turns_never_exceed_the_concurrency_and_always_go_to_the_most_urgent_earliest_waiter(concurrency, steps):
    async def scenario() -> None:
        lanes = IntakeLanes(concurrency=concurrency, backlog=100)
        holding: list[int] = []  # requests holding a turn, by arrival number
        granted: list[tuple[int, int]] = []  # (level, arrival) in the order turns were given
        tasks: dict[int, asyncio.Task] = {}
        levels: dict[int, int] = {}

        async def one(n: int, level: int) -> None:
            await lanes.enter(level=level, cls=str(level))
            granted.append((level, n))
            holding.append(n)

        for n, (op, arg) in enumerate(steps):
            waiting = sorted((levels[k], k) for k, t in tasks.items() if not t.done())
            if op == "enter":
                levels[n] = arg
                tasks[n] = asyncio.create_task(one(n, arg))
            elif op == "leave" and holding:
                holding.pop(0)
                lanes.leave()
            elif op == "cancel" and arg in tasks and not tasks[arg].done():
                tasks[arg].cancel()
                waiting = [w for w in waiting if w[1] != arg]
            before = len(granted)
            await _settle()
            new = granted[before:]
            if op == "leave" and new:  # the freed turn went to the most urgent, earliest waiter
                assert new[0] == waiting[0]
            assert len(holding) == lanes.busy <= concurrency
            still_waiting = [k for k, t in tasks.items() if not t.done()]
            assert not still_waiting or lanes.busy == concurrency  # no one waits beside a free turn

    asyncio.run(scenario())


# --- the lanes in the request path: gateway.intake with a real dispatcher (no HTTP, no database)


def _intake_config():
    from decimal import Decimal

    from scheduling.engine.model import BackendSpec, ClassSpec, QueuePolicy, SchedulerConfig, TenantSpec

    classes = (ClassSpec("INTERACTIVE", 0, 3000, Decimal("1.6")), ClassSpec("BATCH", 2, 60000, Decimal("0.7")))
    return SchedulerConfig(
        classes=classes,
        queue=QueuePolicy(service_ms_prior=100),
        tenants=(TenantSpec("t", 0.5),),
        backends=(BackendSpec("b", ("m",), 1, url="http://x"),),
    )


def _http_request(cls: str, rid: str, content: str = "hi"):
    import json

    from django.test import RequestFactory

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 5})
    return RequestFactory().post(
        "/v1/chat/completions",
        data=body,
        content_type="application/json",
        headers={"Authorization": "Bearer fg_x", "X-Priority-Class": cls, "X-Request-Id": rid},
    )


def test_intake_reads_the_top_class_while_a_lower_class_waits_for_its_turn_and_refuses_past_the_backlog(
    monkeypatch, settings
):
    from gateway import intake as intake_module
    from gateway import lanes as lanes_module
    from gateway.auth import Caller
    from gateway.dispatcher import Dispatcher
    from gateway.payload import CHAT

    settings.FAIRGATE_INTAKE_CONCURRENCY = 1
    settings.FAIRGATE_INTAKE_BACKLOG = 1
    lanes_module.lanes_reset()
    caller = Caller("t", 1, False, ("INTERACTIVE", "BATCH"), "BATCH", "fg_x")

    async def authenticate(_authorization):
        return caller

    monkeypatch.setattr(intake_module, "authenticate", authenticate)

    async def scenario() -> None:
        d = Dispatcher(_intake_config(), audit_pk=None, loop=asyncio.get_running_loop())

        async def dispatcher_get():
            return d

        monkeypatch.setattr(intake_module, "dispatcher_get", dispatcher_get)
        lanes = lanes_module.lanes()
        await lanes.enter(level=2, cls="BATCH")  # a batch request's intake holds the only turn
        waiting = asyncio.create_task(intake_module.intake(_http_request("BATCH", "b-1", "x" * 9000), CHAT))
        await _settle()
        assert not waiting.done() and lanes.waiting(2) == 1  # its body not even parsed yet
        top = await intake_module.intake(_http_request("INTERACTIVE", "i-1"), CHAT)
        assert top.cls == "INTERACTIVE" and not waiting.done()  # read past the waiting batch request
        with pytest.raises(GatewayError) as refused:  # one more batch request: past the backlog of 1
            await intake_module.intake(_http_request("BATCH", "b-2"), CHAT)
        assert (refused.value.status, refused.value.code) == (429, "queue_full")
        lanes.leave()
        asked = await waiting  # its turn: parsed and estimated (off the event loop: a long prompt)
        assert asked.cls == "BATCH" and asked.payload.prompt_tokens > 1000
        assert lanes.busy == 0
        await d.close()

    try:
        asyncio.run(scenario())
    finally:
        lanes_module.lanes_reset()
