"""The Booker's linger: asks no one waits for (releases, journaled settlements, early holds) may
wait for company up to FAIRGATE_BILLING_LINGER_MS, counted from the oldest one's submission. Asks
that gathered behind a batch out for longer than that go as soon as it is answered, not after a
fresh linger (at saturation that added a linger to every batch's cycle)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from billing import client
from billing.booking_asks import ReleaseAsk
from tests.support.booker import booker_with
from tests.unit.gateway.test_id_resent_before_its_release import HeldBackWorker

LINGER_MS = 200
AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def worker(tmp_path, settings, monkeypatch):
    fake = HeldBackWorker()
    with booker_with(
        fake, tmp_path=tmp_path, settings=settings, monkeypatch=monkeypatch, FAIRGATE_BILLING_LINGER_MS=LINGER_MS
    ):
        yield fake


def release(rid: str) -> ReleaseAsk:
    return ReleaseAsk(request_id=rid, reason="cancelled", at=AT)


def test_asks_that_waited_the_linger_behind_a_batch_go_when_it_is_answered(worker):
    async def scenario() -> None:
        books = client.booker()
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        books.submit(release("t/a"), answer=False, urgent=False)
        await asyncio.sleep(0)
        assert worker._answers == []  # alone, with nothing out: it lingers
        while not worker._answers:
            await asyncio.sleep(0.01)
        assert loop.time() - started_s >= LINGER_MS / 1000 * 0.9  # (the loop's timer granularity)
        books.submit(release("t/b"), answer=False, urgent=False)  # behind the batch out
        await asyncio.sleep(LINGER_MS / 1000 * 1.5)  # it has waited longer than the linger by now
        assert len(worker._answers) == 1
        worker.answer()  # the batch out answered: t/b goes at once, in the same callback
        assert len(worker._answers) == 1 and [a.request_id for a in worker._answers[0][0]] == ["t/b"]
        books.submit(release("t/c"), answer=False, urgent=False)  # behind it, fresh: it lingers
        worker.answer()
        assert worker._answers == [] and books._pending
        worker._answers.clear()

    asyncio.run(scenario())
