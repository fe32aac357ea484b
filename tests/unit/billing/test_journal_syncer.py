"""The journal's syncer: a line is on disk when its future is done, whether a process of the
journal's own syncs it (the default) or the journal's thread does; a syncer that dies, before or
while a sync is out, hands its work to the thread and nothing waits for ever; syncs are spaced by
the interval; a settlement whose journal line failed is told its charge from its booking."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import stat
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing import journal
from billing.booking_asks import SettleAsk
from billing.journal import Journal

AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def settle(rid: str) -> SettleAsk:
    return SettleAsk(request_id=rid, backend_name="gpu", prompt_tokens=10, completion_tokens=5, at=AT)


@pytest.fixture(autouse=True)
def var_dir(tmp_path, settings):
    settings.VAR_DIR = tmp_path
    settings.FAIRGATE_JOURNAL_SYNC_INTERVAL_MS = 0
    return tmp_path


def lines_on_disk() -> list[str]:
    return [line for path in sorted(journal.journal_dir().glob("*.jsonl")) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("syncer", [True, False], ids=["syncer", "thread"])
def test_every_line_is_on_disk_when_its_future_is_done(settings, syncer):
    settings.FAIRGATE_JOURNAL_SYNCER = syncer

    async def scenario() -> None:
        mine = Journal("host:1:a")
        for round_ in range(3):
            kept = [mine.keep(settle(f"t/r{round_}-{i}")) for i in range(4)]
            await asyncio.gather(*kept)
            assert len(lines_on_disk()) == 4 * (round_ + 1)
        assert (mine._syncer is not None) is syncer
        process = mine._syncer.process if mine._syncer else None
        mine.close()
        if process is not None:
            assert process.poll() is not None  # closed with its journal

    asyncio.run(scenario())


def test_a_syncer_killed_before_a_sync_hands_it_to_the_thread():
    async def scenario() -> None:
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))
        assert mine._syncer is not None
        mine._syncer.process.kill()
        mine._syncer.process.wait()
        await mine.keep(settle("t/r2"))  # written; its sync asked of a dead syncer: synced by the thread
        await asyncio.wait_for(_syncer_gone(mine), 30)
        assert len(lines_on_disk()) == 2 and not mine._asked and not mine._unsynced
        await mine.keep(settle("t/r3"))  # and from now on by the thread
        assert len(lines_on_disk()) == 3
        mine.close()

    asyncio.run(scenario())


def test_a_syncer_that_dies_with_a_sync_out_hands_it_to_the_thread(settings):
    settings.FAIRGATE_JOURNAL_WAIT = "sync"

    async def scenario() -> None:
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))
        syncer = mine._syncer
        assert syncer is not None
        os.kill(syncer.process.pid, signal.SIGSTOP)  # it will not answer
        out = mine.keep(settle("t/r2"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert mine._syncing is not None and not out.done()  # asked, not answered
        os.kill(syncer.process.pid, signal.SIGKILL)
        await asyncio.wait_for(out, 30)  # the end of its pipe: the thread syncs what it had
        assert len(lines_on_disk()) == 2 and mine._syncer is None
        mine.close()

    asyncio.run(scenario())


def test_syncs_start_no_sooner_than_the_interval_after_the_last(settings, monkeypatch):
    settings.FAIRGATE_JOURNAL_WAIT = "sync"
    settings.FAIRGATE_JOURNAL_SYNC_INTERVAL_MS = 60_000  # the test decides when the next one may go
    delays: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        real_call_later = loop.call_later

        def call_later(delay, callback, *args):
            delays.append(delay)
            return real_call_later(0, callback, *args)  # not a minute: the spacing asked is what is checked

        monkeypatch.setattr(loop, "call_later", call_later)
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))  # the first: at once (no sync before it)
        assert delays == []
        await mine.keep(settle("t/r2"))  # the next: put off to the interval after the first
        assert len(delays) == 1 and 59 < delays[0] <= 60
        mine.close()

    asyncio.run(scenario())
    assert len(lines_on_disk()) == 2


async def _syncer_gone(mine: Journal) -> None:
    while mine._syncer is not None:
        await asyncio.sleep(0.01)


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _all_synced(mine: Journal) -> None:
    """Until nothing written waits for its sync, none is out, none is put off."""
    while mine._asked or mine._unsynced or mine._sync_timer is not None:
        await asyncio.sleep(0.01)


def test_waiting_for_the_write_an_answer_goes_on_before_the_sync_which_still_follows(settings, monkeypatch):
    """FAIRGATE_JOURNAL_WAIT=write (the default): a line's future is done once it is written, while
    its sync is still out; the sync is asked all the same, one out at a time, spaced by the interval."""
    settings.FAIRGATE_JOURNAL_WAIT = "write"
    settings.FAIRGATE_JOURNAL_SYNC_INTERVAL_MS = 60_000
    asked: list[list[str]] = []
    real_ask = journal._Syncer.ask

    def ask(self, seq, paths):
        asked.append(paths)
        real_ask(self, seq, paths)

    monkeypatch.setattr(journal._Syncer, "ask", ask)

    async def scenario() -> None:
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))  # starts the syncer; the first sync goes at once
        syncer = mine._syncer
        assert syncer is not None
        await _all_synced(mine)
        assert len(asked) == 1 and asked[0] == [str(mine._current.path)]
        os.kill(syncer.process.pid, signal.SIGSTOP)  # the next sync will not be answered
        mine._synced_at_s = float("-inf")  # (the interval is not what this step checks)
        await asyncio.wait_for(mine.keep(settle("t/r2")), 30)  # done: written, not synced
        await _turns()
        assert mine._asked and len(asked) == 2  # its sync is out, unanswered
        await asyncio.wait_for(mine.keep(settle("t/r3")), 30)  # done while the sync is out
        assert len(lines_on_disk()) == 3 and mine._unsynced and len(asked) == 2  # its sync waits its turn
        os.kill(syncer.process.pid, signal.SIGCONT)
        while mine._asked:
            await asyncio.sleep(0.01)
        assert mine._sync_timer is not None and mine._unsynced and len(asked) == 2  # r3's: put off by the interval
        mine.close()

    asyncio.run(scenario())


def test_waiting_for_the_write_the_interval_spaces_syncs(settings, monkeypatch):
    settings.FAIRGATE_JOURNAL_WAIT = "write"
    settings.FAIRGATE_JOURNAL_SYNC_INTERVAL_MS = 60_000
    delays: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        real_call_later = loop.call_later

        def call_later(delay, callback, *args):
            if getattr(callback, "__name__", "") != "_ask_sync":  # (the test's own sleeps)
                return real_call_later(delay, callback, *args)
            delays.append(delay)
            return real_call_later(0, callback, *args)

        monkeypatch.setattr(loop, "call_later", call_later)
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))
        await _all_synced(mine)
        assert delays == [0]  # the first sync: at once
        await mine.keep(settle("t/r2"))  # done at once all the same
        assert len(delays) == 2 and 59 < delays[1] <= 60  # its sync put off to the interval after the first
        await _all_synced(mine)
        mine.close()

    asyncio.run(scenario())
    assert len(lines_on_disk()) == 2


def test_waiting_for_the_write_a_syncer_that_dies_leaves_its_sync_to_the_thread(settings, monkeypatch):
    settings.FAIRGATE_JOURNAL_WAIT = "write"
    synced: list[list[int]] = []
    real_sync_all = journal._sync_all
    monkeypatch.setattr(journal, "_sync_all", lambda fds: (synced.append(list(fds)), real_sync_all(fds)))

    async def scenario() -> None:
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))
        syncer = mine._syncer
        assert syncer is not None
        await _all_synced(mine)
        os.kill(syncer.process.pid, signal.SIGSTOP)
        await asyncio.wait_for(mine.keep(settle("t/r2")), 30)
        await _turns()
        assert mine._asked  # out with the stopped syncer
        fd = mine._current.fd
        os.kill(syncer.process.pid, signal.SIGKILL)
        while mine._syncer is not None or not synced:
            await asyncio.sleep(0.01)
        assert synced[0] == [fd] and not mine._asked and not mine._unsynced  # the thread synced it
        await asyncio.wait_for(mine.keep(settle("t/r3")), 30)  # from now on written and synced by the thread
        assert len(lines_on_disk()) == 3 and len(synced) == 2
        mine.close()

    asyncio.run(scenario())


def test_a_settlement_whose_line_could_not_be_synced_is_told_its_charge_once_booked(tmp_path, settings, monkeypatch):
    """The answer's end waits for the booking instead (booked twice, charged once: booking is
    idempotent per request id)."""
    from billing.booking_asks import Charged
    from gateway import charging
    from tests.support.booker import booker_with
    from tests.unit.gateway.test_id_resent_before_its_release import HeldBackWorker

    fake = HeldBackWorker()
    monkeypatch.setattr(fake, "_result", staticmethod(lambda ask: Charged(Decimal("0.25"))))
    stack = contextlib.ExitStack()
    books = stack.enter_context(
        booker_with(
            fake,
            tmp_path=tmp_path,
            settings=settings,
            monkeypatch=monkeypatch,
            FAIRGATE_BILLING_LINGER_MS=0,
            FAIRGATE_JOURNAL_SYNCER=False,
        )
    )

    def failed_sync(fds):
        raise OSError(5, "Input/output error")

    real_write = journal._write
    monkeypatch.setattr(journal, "_write", lambda ops, sync=True: failed_sync([]))
    books.prices = {"gpu": charging.UnitPrices(Decimal("0.001"), Decimal("0.002"))}
    held = charging.Hold("t", "t/r1", "BATCH", "m", 10, 5, amount=Decimal("1"), factor=Decimal("0.5"))

    async def scenario() -> None:
        told = charging.settle(held, backend="gpu", prompt_tokens=10, output_tokens=5)
        assert told is not None
        while not (fake._answers and books._pending):  # the first booking out; the answer's own behind it
            assert not told.done()
            await asyncio.sleep(0.01)
        fake.answer()  # the booking nobody waits for
        await asyncio.sleep(0)
        assert not told.done() and len(fake._answers) == 1  # the answer waits for its own
        fake.answer()
        assert await told == Charged(Decimal("0.25"))
        monkeypatch.setattr(journal, "_write", real_write)
        stack.close()

    asyncio.run(scenario())
    assert [type(ask).__name__ for ask in fake.sent] == ["SettleAsk", "SettleAsk"]


@pytest.mark.parametrize("syncer", [True, False], ids=["syncer", "thread"])
def test_a_new_segments_name_is_synced_off_the_event_loop_by_the_syncer(settings, monkeypatch, syncer):
    """The directory sync a new segment needs: the syncer's, with its first lines (on a disk the
    database's WAL shares it costs as long as a file's sync); only the thread's fallback does it
    on the event loop, before the segment's first line."""
    settings.FAIRGATE_JOURNAL_SYNCER = syncer
    on_the_loop: list[str] = []
    real_sync_dir = journal.sync_dir

    def sync_dir(directory) -> None:
        on_the_loop.append(str(directory))
        real_sync_dir(directory)

    monkeypatch.setattr(journal, "sync_dir", sync_dir)

    async def scenario() -> None:
        mine = Journal("host:1:a")
        await mine.keep(settle("t/r1"))
        await _all_synced(mine)
        assert on_the_loop == ([] if syncer else [str(journal.journal_dir())])
        mine.close()

    asyncio.run(scenario())
    assert len(lines_on_disk()) == 1


def test_the_syncer_syncs_the_directory_of_each_file_it_opens(tmp_path, monkeypatch):
    from billing import journal_sync

    directories: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            directories.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    first, second = tmp_path / "a.0.jsonl", tmp_path / "a.1.jsonl"
    for path in (first, second):
        path.write_text("{}\n")
    asked = [[1, [str(first)]], [2, [str(first)]], [3, [str(first), str(second)]]]
    answers = io.BytesIO()
    journal_sync.serve([json.dumps(request).encode() for request in asked], answers)
    assert [json.loads(line) for line in answers.getvalue().splitlines()] == [[1, 0], [2, 0], [3, 0]]
    assert directories == [str(tmp_path), str(tmp_path)]  # once per file, when it is first opened
