"""fairgate_billing_wait_seconds counts the answers that did wait for billing, and only those: a
settlement whose journal line is not on disk yet when the answer ends, an early hold still being
booked when the backend answered."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from billing.booking_asks import Charged
from gateway import charging, metrics
from gateway.admission import Bill


def _count(step: str) -> float:
    return metrics.REGISTRY.get_sample_value("fairgate_billing_wait_seconds_count", {"step": step}) or 0.0


def _hold() -> charging.Hold:
    return charging.Hold("acme", "acme/r1", "BATCH", "m", 10, 10, Decimal("0.01"), False, Decimal(1))


def test_a_settlement_already_on_disk_is_not_counted_one_still_syncing_is():
    async def scenario() -> tuple[Charged | None, Charged | None]:
        loop = asyncio.get_running_loop()
        bill = Bill(_hold())
        bill.settlement = loop.create_future()
        bill.settlement.set_result(Charged(Decimal("0.01")))
        at_once = await bill.settled()
        assert _count("settlement") == before
        bill.settlement = loop.create_future()
        loop.call_soon(bill.settlement.set_result, Charged(Decimal("0.02")))
        return at_once, await bill.settled()

    before = _count("settlement")
    at_once, later = asyncio.run(scenario())
    assert at_once == Charged(Decimal("0.01")) and later == Charged(Decimal("0.02"))
    assert _count("settlement") == before + 1


def test_an_early_hold_still_being_booked_at_its_confirmation_is_counted(monkeypatch):
    async def scenario() -> charging.Hold:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        early = charging.EarlyHold(_hold(), future)
        monkeypatch.setattr(charging.EarlyHold, "booked", lambda self: _booked(self.future))
        loop.call_soon(future.set_result, None)
        bill = Bill(early)
        await bill.confirm()
        return bill.held

    async def _booked(future: asyncio.Future) -> charging.Hold:
        await future
        return _hold()

    before = _count("hold")
    assert asyncio.run(scenario()) == _hold()
    assert _count("hold") == before + 1
