"""The settlement journal: every line on disk before its future is done, segments removed once
booked, what a dead process left replayed once (by its billing worker or the next process on the
host), never taken from a process that is alive."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing import journal
from billing.booking_asks import Charged, SettleAsk
from billing.client.unbooked import Unbooked
from billing.errors import BillingError, DatabaseUnavailable, HoldNotFound, transient
from billing.journal import Journal
from billing.journal_segments import journal_replay, journal_retire, journals_locked, journals_orphaned

AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def settle(rid: str, base: str | None = None) -> SettleAsk:
    return SettleAsk(
        request_id=rid,
        backend_name="gpu",
        prompt_tokens=10,
        completion_tokens=5,
        at=AT,
        base_cost=None if base is None else Decimal(base),
    )


@pytest.fixture(autouse=True)
def var_dir(tmp_path, settings):
    settings.VAR_DIR = tmp_path
    return tmp_path


def lines_on_disk() -> list[str]:
    return [line for path in sorted(journal.journal_dir().glob("*.jsonl")) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("wait", ["write", "sync"])
def test_a_kept_settlement_is_on_disk_when_its_future_is_done_and_a_dead_process_leaves_it(settings, wait):
    settings.FAIRGATE_JOURNAL_WAIT = wait

    async def scenario() -> None:
        mine = Journal("host:1:a")
        first, second = mine.keep(settle("t/r1", "0.0123456789")), mine.keep(settle("t/r2"))
        if wait == "write":  # written at once: done before the event loop turns
            assert len(lines_on_disk()) == 2 and first.done() and second.done()
        else:  # written and synced after this turn, in one write
            assert lines_on_disk() == [] and not first.done()
        await asyncio.gather(first, second)
        assert len(lines_on_disk()) == 2
        mine.booked("t/r1")
        assert journals_orphaned() == []  # its process (this one) holds the lock
        mine.close()  # stopped with t/r2 not booked: the segment stays

    asyncio.run(scenario())
    (found,) = journals_orphaned()
    path, fd, asks = found
    assert asks == [settle("t/r1", "0.0123456789"), settle("t/r2")]  # no booked marks: a replay books both once more
    journal_retire(path, fd)
    assert not path.exists() and journals_orphaned() == []


def test_segments_rotate_and_go_once_every_settlement_in_them_is_booked(monkeypatch):
    monkeypatch.setattr(journal, "ROTATE_LINES", 2)

    async def scenario() -> None:
        mine = Journal("host:1:a")
        await asyncio.gather(*(mine.keep(settle(f"t/r{i}")) for i in range(3)))
        assert len(list(journal.journal_dir().glob("*.jsonl"))) == 2  # 2 lines, then a new segment
        mine.booked("t/r0")
        await mine.keep(settle("t/r9"))  # (removals go through the same queue as the writes)
        assert len(list(journal.journal_dir().glob("*.jsonl"))) == 2  # t/r1 still open in the first
        mine.booked("t/r1")
        await mine.keep(settle("t/r10"))
        for _ in range(100):  # the removal goes at the end of a turn (written at once, t/r10 waited for none)
            if not mine._flushing:
                break
            await asyncio.sleep(0)
        remaining = sorted(journal.journal_dir().glob("*.jsonl"))
        assert [p.name for p in remaining] == ["host:1:a.1.jsonl", "host:1:a.2.jsonl"]  # the first went
        assert len(mine) == 3
        for rid in ("t/r2", "t/r9", "t/r10"):
            mine.booked(rid)
        mine.close()  # everything booked: nothing stays

    asyncio.run(scenario())
    assert list(journal.journal_dir().glob("*.jsonl")) == []


def test_a_line_cut_by_a_crash_is_skipped():
    async def scenario() -> Journal:
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))
        mine.close()
        return mine

    asyncio.run(scenario())
    (path,) = journal.journal_dir().glob("*.jsonl")
    with open(path, "ab") as cut:
        cut.write(b'{"settle": {"request_id": "t/r2", "back')
    (found,) = journals_orphaned()
    assert found[2] == [settle("t/r1")]
    journal_retire(found[0], found[1])


def test_a_journal_locked_by_another_live_process_is_not_taken():
    path = journal.journal_dir() / "host:2:b.0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        '{"settle": {"request_id": "t/r9", "backend_name": "gpu", "prompt_tokens": 1, '
        '"completion_tokens": 1, "at": "2026-12-01T09:00:00+00:00"}}\n'
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import fcntl, os, sys
fd = os.open({str(path)!r}, os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
""",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert journals_orphaned() == []
        assert journal_replay("host:2:b", lambda asks: pytest.fail("booked a live process's journal")) == (0, 0)
        assert journals_locked("host:2:b") == 1  # a dead gateway's worker looks again while it is locked
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert journals_locked("host:2:b") == 0  # now its process is gone
    (found,) = journals_orphaned()
    assert [a.request_id for a in found[2]] == ["t/r9"]
    journal_retire(found[0], found[1])


def test_a_dead_gateways_worker_replays_its_journal_and_keeps_what_it_cannot_book():
    async def dead(owner: str, rids: list[str]) -> None:
        mine = Journal(owner)
        await asyncio.gather(*(mine.keep(settle(rid, "0.5")) for rid in rids))
        mine.close()

    asyncio.run(dead("host:5:e", ["t/a", "t/b"]))
    asyncio.run(dead("host:6:f", ["t/c"]))
    booked_asks: list[SettleAsk] = []

    def book(asks):
        booked_asks.extend(asks)
        return [Charged(Decimal("0.5")) if ask.request_id == "t/a" else HoldNotFound("gone") for ask in asks]

    assert journal_replay("host:5:e", book) == (2, 0)  # booked, or past help: the journal goes
    assert [a.request_id for a in booked_asks] == ["t/a", "t/b"] and booked_asks[0].base_cost == Decimal("0.5")
    assert [p.name for p in journal.journal_dir().glob("*.jsonl")] == ["host:6:f.0.jsonl"]  # only its own
    assert journal_replay("host:6:f", lambda asks: [DatabaseUnavailable("down")] * len(asks)) == (0, 1)
    assert [p.name for p in journal.journal_dir().glob("*.jsonl")] == ["host:6:f.0.jsonl"]  # stays for the next


def test_only_failures_that_may_not_recur_are_retried():
    assert transient(DatabaseUnavailable("down")) and transient(RuntimeError("worker gone"))
    assert not transient(HoldNotFound("never held")) and not transient(BillingError("refused"))


def test_unbooked_settlements_are_retried_and_adopted_by_the_next_process(monkeypatch):
    from billing import heartbeats

    monkeypatch.setattr(heartbeats, "_owner", "host:3:c")
    resubmitted = []

    async def scenario() -> None:
        kept = Unbooked(resubmitted.append)
        await asyncio.gather(kept.journal.keep(settle("t/r1")), kept.journal.keep(settle("t/r2")))
        kept.failed(settle("t/r1"), DatabaseUnavailable("down"))
        kept.failed(settle("t/r2"), HoldNotFound("never held"))  # dropped: retrying cannot help
        assert len(kept) == 1 and len(kept.journal) == 1
        while not resubmitted:
            await asyncio.sleep(0.05)
        kept.close()  # stopped with a settlement pending: the journal stays for the next start

    asyncio.run(scenario())
    assert resubmitted[0] == settle("t/r1")
    monkeypatch.setattr(heartbeats, "_owner", "host:4:d")  # the next process on this host

    async def next_start() -> None:
        kept = Unbooked(resubmitted.append)
        assert kept.adopt_orphans() == 2  # both lines: a replay books a settlement once more
        kept.booked(settle("t/r1"))
        kept.booked(settle("t/r2"))
        kept.close()

    asyncio.run(next_start())
    assert journals_orphaned() == [] and lines_on_disk() == []  # adopted, booked, nothing left behind


def test_an_id_is_settling_from_its_first_kept_attempt_until_every_attempt_is_booked():
    async def scenario() -> None:
        mine = Journal("host:1:a")
        assert not mine.settling("t/r1")
        await mine.keep(settle("t/r1#2"))  # the second attempt sent with id r1 was served
        await mine.keep(settle("t/r1#2"))  # kept again (sent once more): still one
        assert mine.settling("t/r1") and not mine.settling("t/r") and not mine.settling("t/r10")
        mine.booked("t/r1#2")
        assert not mine.settling("t/r1")
        mine.close()

    asyncio.run(scenario())


def test_a_line_reads_back_as_the_settlement_it_was_written_from():
    for ask in (
        SettleAsk('t/"odd" id \u00e9\n', "gpu \\ one", 0, 123456, AT, Decimal("0.000000000123")),
        settle("t/plain"),
    ):
        line = journal._line(ask)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert journal._ask(json.loads(line)["settle"]) == ask
