"""Finished requests' records are kept untracked by the garbage collector: the terminal log holds
up to 100,000 of them, and tracked ones made every full collection walk them all (a gateway's CPU
per request rose by a quarter as the log filled, measured at saturation)."""

from __future__ import annotations

import asyncio
import gc

from gateway.dispatch_core import Entry, describe
from gateway.lifecycle import Outcome
from gateway.terminal import TerminalLog


def test_a_record_with_an_enum_value_is_kept_as_plain_text():
    log = TerminalLog(keep_ms=60_000, max_entries=10)
    record = {"id": "r1", "state": Outcome.COMPLETED, "waited_ms": 3, "job": None}
    assert gc.is_tracked(record)  # (what the log must not keep)
    log.add("t", "r1", record, now_ms=0)
    kept = log.get("t", "r1", now_ms=0)
    assert kept == {"id": "r1", "state": "completed", "waited_ms": 3, "job": None}
    assert not gc.is_tracked(kept) and type(kept["state"]) is str


def test_a_finished_requests_description_is_untracked():
    loop = asyncio.new_event_loop()
    try:
        entry = Entry("t/r1", "r1", "t", "m", "BATCH", "BATCH", None, 0, loop.create_future(), job="j")
        entry.state = Outcome.CANCELLED
        record = describe(entry, position=None)
        record["finished_at"] = "2026-12-02T09:00:00+00:00"
        assert not gc.is_tracked(record) and type(record["state"]) is str
    finally:
        loop.close()
