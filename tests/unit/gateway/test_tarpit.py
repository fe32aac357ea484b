"""The tarpit of refused keys (gateway.tarpit): free within its rate and burst, then held back,
never more at once than its bound; free tokens come back with time. Time is injected."""

from __future__ import annotations

import asyncio

from gateway.tarpit import Tarpit


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_refusals_past_the_burst_are_held_until_free_tokens_come_back():
    clock = Clock()
    pit = Tarpit(free_per_s=4, burst=3, delay_s=5.0, max_waiting=10, clock=clock, jitter=lambda: 0.5)
    assert [pit.delay_of_next() for _ in range(5)] == [0.0, 0.0, 0.0, 5.0, 5.0]
    clock.now_s += 0.125  # half a token
    assert pit.delay_of_next() == 5.0
    clock.now_s += 0.125  # one token
    assert [pit.delay_of_next() for _ in range(2)] == [0.0, 5.0]
    clock.now_s += 60  # never more than the burst
    assert [pit.delay_of_next() for _ in range(4)] == [0.0, 0.0, 0.0, 5.0]


def test_no_more_than_its_bound_wait_at_once_and_a_waiter_leaves_when_its_client_does():
    async def scenario() -> None:
        pit = Tarpit(free_per_s=1, burst=1, delay_s=60.0, max_waiting=2, clock=Clock(), jitter=lambda: 0.5)
        await pit.hold()  # free
        held = [asyncio.create_task(pit.hold()) for _ in range(2)]
        await asyncio.sleep(0)
        assert pit.waiting == 2
        await asyncio.wait_for(pit.hold(), timeout=5)  # the bound is reached: answered at once
        held[0].cancel()
        await asyncio.gather(held[0], return_exceptions=True)
        assert pit.waiting == 1
        held[1].cancel()
        await asyncio.gather(held[1], return_exceptions=True)
        assert pit.waiting == 0

    asyncio.run(scenario())
