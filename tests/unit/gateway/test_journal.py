"""The journal of settlements that could not be booked: durable, replayed once by the next process
on the host, never taken from a process that is alive."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from billing.booking import SettleAsk
from billing.errors import BillingError, DatabaseUnavailable, HoldNotFound
from gateway import journal
from gateway.journal import Journal, journal_retire, journals_orphaned
from gateway.unbooked import Unbooked, transient

AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def settle(rid: str) -> SettleAsk:
    return SettleAsk(request_id=rid, backend_name="gpu", prompt_tokens=10, completion_tokens=5, at=AT)


@pytest.fixture(autouse=True)
def var_dir(tmp_path, settings):
    settings.VAR_DIR = tmp_path
    return tmp_path


def test_what_is_kept_and_not_done_is_what_a_dead_process_leaves():
    mine = Journal("host:1:a")
    mine.keep([settle("t/r1"), settle("t/r2")])
    mine.done(["t/r1"])
    assert journals_orphaned() == []  # its process (this one) holds the lock
    mine.close()  # the process is gone
    (found,) = journals_orphaned()
    path, fd, asks = found
    assert asks == [settle("t/r2")]
    journal_retire(path, fd)
    assert not path.exists() and journals_orphaned() == []


def test_a_line_cut_by_a_crash_is_skipped(var_dir):
    mine = Journal("host:1:a")
    mine.keep([settle("t/r1")])
    mine.close()
    with open(mine.path, "ab") as cut:
        cut.write(b'{"settle": {"request_id": "t/r2", "back')
    (found,) = journals_orphaned()
    assert found[2] == [settle("t/r1")]
    journal_retire(found[0], found[1])


def test_a_journal_locked_by_another_live_process_is_not_taken(var_dir):
    path = journal.journal_dir() / "host:2:b.jsonl"
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
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    (found,) = journals_orphaned()  # now its process is gone
    assert [a.request_id for a in found[2]] == ["t/r9"]
    journal_retire(found[0], found[1])


def test_only_failures_that_may_not_recur_are_retried():
    assert transient(DatabaseUnavailable("down")) and transient(RuntimeError("worker gone"))
    assert not transient(HoldNotFound("never held")) and not transient(BillingError("refused"))


def test_unbooked_settlements_are_journaled_retried_and_adopted(monkeypatch):
    import asyncio

    from billing import heartbeats

    monkeypatch.setattr(heartbeats, "_owner", "host:3:c")
    resubmitted = []

    async def scenario() -> None:
        kept = Unbooked(resubmitted.append)
        kept.failed(settle("t/r1"), DatabaseUnavailable("down"))
        kept.failed(settle("t/r2"), HoldNotFound("never held"))  # dropped: retrying cannot help
        assert len(kept) == 1
        while not resubmitted:
            await asyncio.sleep(0.05)
        kept.close()  # stopped with a settlement pending: the journal stays for the next start

    asyncio.run(scenario())
    assert resubmitted[0] == settle("t/r1")
    monkeypatch.setattr(heartbeats, "_owner", "host:4:d")  # the next process on this host

    async def next_start() -> None:
        kept = Unbooked(resubmitted.append)
        assert kept.adopt_orphans() == 1
        kept.booked(settle("t/r1"))
        kept.close()

    asyncio.run(next_start())
    assert journals_orphaned() == []  # adopted, booked, and nothing left behind
