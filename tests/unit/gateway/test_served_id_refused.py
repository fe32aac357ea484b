"""An id served a moment ago by this process is refused at once, even while its settlement is
only in the journal: the booking cannot know the id was used until the settlement is booked, and
a hold under the same id would otherwise be given the served request's open hold (found on the
live suite: the client resent the id right after its answer, and was served again uncharged)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing import client
from billing.booking_asks import SettleAsk
from billing.client import group_commit
from billing.inflight import HeldEntry
from gateway import charging
from gateway.errors import GatewayError


@pytest.fixture
def fresh_booker(tmp_path, settings, monkeypatch):
    settings.VAR_DIR = tmp_path
    settings.FAIRGATE_BILLING = True
    settings.FAIRGATE_EARLY_HOLDS = True
    books = client.Booker()
    monkeypatch.setattr(group_commit, "_booker", books)
    monkeypatch.setattr(books, "submit", lambda *a, **k: pytest.fail("nothing may be sent to the billing worker"))
    yield books
    books.unbooked.close()
    client.budget_room_memo.clear()


def test_a_served_id_whose_settlement_is_not_booked_yet_is_refused_before_anything_is_held(fresh_booker):
    what = dict(tenant="t", request_id="t/again", cls="BATCH", model="m", prompt_tokens=5, max_output_tokens=5)

    async def scenario() -> None:
        ask = SettleAsk(
            request_id="t/again#2", backend_name="gpu", prompt_tokens=5, completion_tokens=5, at=datetime.now(UTC)
        )
        await fresh_booker.unbooked.journal.keep(ask)  # served; its booking has not happened yet
        room = HeldEntry("t/other", 1, 1, None, "BATCH", 1, "m", Decimal(1), Decimal("0.01"), room=Decimal(1000))
        client.budget_room_memo.learn("t", 10, room, time.monotonic())  # ample room: it would be held early
        assert charging.hold_early(**what) is None  # not sent upstream on an early hold
        with pytest.raises(GatewayError) as refused:
            await charging.hold(**what)
        assert refused.value.status == 400 and "served" in str(refused.value)

    asyncio.run(scenario())
