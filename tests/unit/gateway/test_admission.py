"""Admission releases the hold on every way out that serves nothing.

With the embedded dispatcher, admitting to the engine cannot be interrupted (it does not await);
with the shared scheduler it awaits the dispatcher's answer, and a client that left then cancelled
the admission with its hold still booked (held until a sweep found it)."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from gateway import admission, charging
from gateway.auth import Caller
from gateway.intake import Asked
from gateway.lifecycle import Outcome, PublicId
from gateway.payload import Payload


class NeverAnswers:
    """A dispatcher whose admission waits (the shared scheduler's, before its answer)."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()

    def now_ms(self) -> int:
        return 0

    async def admit(self, *args, **kwargs):
        self.waiting.set()
        await asyncio.Event().wait()


def test_a_client_leaving_while_admission_waits_releases_its_hold(monkeypatch):
    held = charging.Hold("t", "t/r1", "BATCH", "m", 5, 5, amount=Decimal("0.5"), factor=Decimal("1"))
    released: list[tuple[charging.Hold, str]] = []

    async def hold(**_):
        return held

    monkeypatch.setattr(charging, "hold", hold)
    monkeypatch.setattr(charging, "release", lambda h, *, reason: released.append((h, reason)))
    caller = Caller("t", 1, False, (), "BATCH", "fg_x")
    payload = Payload("chat", {}, b"{}", "m", False, False, 5, 1, prompt_tokens=5, prompt_bound=5, output_limit=5)

    async def scenario() -> None:
        d = NeverAnswers()
        asked = Asked(d, caller, PublicId("r1"), payload, "BATCH", "BATCH", None, None)  # type: ignore[arg-type]
        task = asyncio.get_running_loop().create_task(admission.admit(asked, early=False))
        await d.waiting.wait()  # held, now waiting for the scheduler's answer
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert released == [(held, Outcome.CANCELLED)]
