"""The gateway's memo of holds (the console's queue table reads it): the gateway remembers each
hold its billing worker booked and forgets it once the request's settlement or release is booked.
The ends go without their hold: the worker that booked it remembers it (billing.worker)."""

from __future__ import annotations

import asyncio
import pickle
from decimal import Decimal

import pytest

from billing.booking_asks import Charged, HoldAsk, ReleaseAsk, SettleAsk
from billing.inflight import HeldEntry, held_get_cached
from gateway import charging
from tests.support.booker import booker_with


class FakeWorker:
    """Answers each batch at once, as the billing worker would: a hold is booked, an end too."""

    dead = False

    def __init__(self) -> None:
        self.batches: list[list] = []

    def send(self, asks: list, on_answer) -> None:
        self.batches.append(asks)
        results = [self._result(ask) for ask in asks]
        answer = pickle.dumps((results, {}, None))
        asyncio.get_running_loop().call_soon(on_answer, answer)

    @staticmethod
    def _result(ask) -> object:
        if isinstance(ask, HoldAsk):
            return HeldEntry(ask.request_id, 1, 1, None, ask.class_name, 1, ask.model, Decimal(1), Decimal("0.5"))
        return Charged(Decimal("0.2")) if isinstance(ask, SettleAsk) else True


@pytest.fixture
def booker(tmp_path, settings, monkeypatch):
    worker = FakeWorker()
    with booker_with(
        worker, tmp_path=tmp_path, settings=settings, monkeypatch=monkeypatch, FAIRGATE_EARLY_HOLDS=False
    ) as books:
        yield books, worker


def _hold(rid: str):
    return charging.hold(tenant="t", request_id=rid, cls="BATCH", model="m", prompt_tokens=5, max_output_tokens=5)


def test_the_gateway_remembers_each_hold_until_its_end_is_booked_and_sends_the_end_without_it(booker):
    books, worker = booker

    async def scenario() -> None:
        served, refused = await _hold("t/a"), await _hold("t/b")
        assert held_get_cached("t/a") is not None and held_get_cached("t/b") is not None
        await charging.settle(served, backend="gpu", prompt_tokens=5, output_tokens=3)
        charging.release(refused, reason="queue_full")
        while held_get_cached("t/a") is not None or held_get_cached("t/b") is not None:
            await asyncio.sleep(0.001)  # forgotten once booked
        ends = [ask for batch in worker.batches for ask in batch if not isinstance(ask, HoldAsk)]
        assert [type(ask) for ask in ends] == [SettleAsk, ReleaseAsk]
        assert [(ask.request_id, ask.held) for ask in ends] == [("t/a", None), ("t/b", None)]
        books.unbooked.close()

    asyncio.run(scenario())
