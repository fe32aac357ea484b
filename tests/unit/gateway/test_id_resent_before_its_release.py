"""An id sent again right after its request ended unserved: the new request's hold is booked after
the old one's release, never before it. The booking gives a hold asked again under an open hold's
id by the same process that open hold (a retried admission, its billing worker replaced), so a new
request booked before the old one's release would get the old hold, which the release then gives
back under it: served on a hold no longer there (found on the live suite under load: an early hold
ended 502 before it was booked, and the client resent its id at once). Also: a caller that leaves
just as its hold is booked leaves nothing held."""

from __future__ import annotations

import asyncio
import pickle
import time
from decimal import Decimal

import pytest

from billing import client
from billing.booking_asks import HoldAsk, ReleaseAsk
from billing.inflight import HeldEntry
from gateway import charging
from tests.support.booker import booker_with

RID = "t/again"
WHAT = dict(tenant="t", request_id=RID, cls="BATCH", model="m", prompt_tokens=5, max_output_tokens=5)


class HeldBackWorker:
    """A billing worker that answers a batch only when the test says (`answer`), in order."""

    dead = False

    def __init__(self) -> None:
        self.sent: list[object] = []  # every ask, in the order the worker got them
        self._answers: list[tuple[list, object]] = []

    def send(self, asks: list, on_answer) -> None:
        self.sent.extend(asks)
        self._answers.append((asks, on_answer))

    def answer(self, then=None) -> None:
        """Answers the oldest batch out; ``then`` runs right after, in the same callback."""
        asks, on_answer = self._answers.pop(0)
        results = [self._result(ask) for ask in asks]
        on_answer(pickle.dumps((results, {}, None)))
        if then is not None:
            then()

    @staticmethod
    def _result(ask) -> object:
        if isinstance(ask, HoldAsk):
            room = Decimal(1000)
            return HeldEntry(
                ask.request_id, 1, 1, None, ask.class_name, 1, ask.model, Decimal(1), Decimal("0.5"), room=room
            )
        return True


@pytest.fixture
def worker(tmp_path, settings, monkeypatch):
    fake = HeldBackWorker()
    with booker_with(
        fake,
        tmp_path=tmp_path,
        settings=settings,
        monkeypatch=monkeypatch,
        FAIRGATE_EARLY_HOLDS=True,
        FAIRGATE_BILLING_LINGER_MS=0,
    ):
        yield fake


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _answer_all(worker: HeldBackWorker) -> None:
    """Answers every batch out, and those its answers send, in order."""
    while worker._answers:
        worker.answer()
        await _turns()


def _resent_after(worker: HeldBackWorker, end_first) -> None:
    """The first request of RID ends unserved through ``end_first`` (its hold out, unanswered);
    the client sends the id again at once; then the billing worker answers everything."""

    async def scenario() -> None:
        await end_first()
        again = asyncio.create_task(charging.hold(**WHAT))
        await _turns()
        await _answer_all(worker)
        await again
        assert _kinds(worker.sent) == ["HoldAsk", "ReleaseAsk", "HoldAsk"]

    asyncio.run(scenario())


def _kinds(sent: list[object]) -> list[str]:
    return [type(ask).__name__ for ask in sent if getattr(ask, "request_id", None) == RID]


def test_an_early_hold_released_before_it_was_booked_is_released_before_the_ids_next_hold(worker):
    async def end_first() -> None:
        room = HeldEntry("t/other", 1, 1, None, "BATCH", 1, "m", Decimal(1), Decimal("0.01"), room=Decimal(1000))
        client.budget_room_memo.learn("t", 10, room, time.monotonic())  # ample room: held early
        early = charging.hold_early(**WHAT)
        assert early is not None
        await _turns()  # its hold is out, not answered
        charging.release(early, reason="upstream_error")  # ended 502 before its hold was booked

    _resent_after(worker, end_first)


def test_a_hold_whose_caller_left_while_it_was_booked_is_released_before_the_ids_next_hold(worker):
    async def end_first() -> None:
        first = asyncio.create_task(charging.hold(**WHAT))
        await _turns()  # its hold is out
        first.cancel()  # the client left
        await _turns()

    _resent_after(worker, end_first)


def test_a_caller_that_leaves_as_its_hold_is_booked_leaves_nothing_held(worker):
    async def scenario() -> None:
        first = asyncio.create_task(charging.hold(**WHAT))
        await _turns()
        worker.answer(then=first.cancel)  # booked, and the client leaves before the task resumes
        with pytest.raises(asyncio.CancelledError):
            await first
        await _turns()
        await _answer_all(worker)
        assert _kinds(worker.sent) == ["HoldAsk", "ReleaseAsk"]
        released = [ask for ask in worker.sent if isinstance(ask, ReleaseAsk)]
        assert released[0].reason == "cancelled"

    asyncio.run(scenario())
