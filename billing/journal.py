"""The settlement journal: every settlement in a local file before its client gets the last byte.

`Journal.keep` appends a request's settlement (one line) and returns a future the answer's end
waits for (``FAIRGATE_JOURNAL_WAIT``: the line's write, or its sync); the settlement is booked
meanwhile (billing.client) and `Journal.booked` lets its line go. Lines are synced by a syncer
process (billing.journal_syncer), else by a thread. Segment files and the recovery of a dead
process's journal: billing.journal_segments. Why and what each failure costs: docs/money.md.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from billing.booking_asks import SettleAsk, attempt_of
from billing.journal_segments import (
    SUFFIX,
    journal_dir,
    journals_orphaned,
    safe_owner,
    unlink_segment,
)
from billing.journal_segments import ask_of as _ask  # noqa: F401 -- read back here by the line-format test
from billing.journal_segments import line_of as _line
from billing.journal_sync import sync_dir
from billing.journal_syncer import JournalSyncer as _Syncer

log = logging.getLogger(__name__)
ROTATE_LINES = 10_000  # a replay books at most about this many settlements once more
ROTATE_S = 10.0


@dataclass(eq=False)  # one per file: compared, and kept in sets, by identity
class _Segment:
    path: Path
    fd: int
    opened_s: float
    lines: int = 0
    open_asks: int = 0  # its settlements not booked yet
    taking: bool = True  # still takes new lines (only the current segment does)

    def full(self) -> bool:
        return self.lines >= ROTATE_LINES or time.monotonic() - self.opened_s >= ROTATE_S


class Journal:
    """This process's journal, used from its event loop: opened (and locked) on first use."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._next = 0
        self._current: _Segment | None = None
        self._segments: list[_Segment] = []  # every segment open (its lock held), adopted ones too
        self._where: dict[str, _Segment] = {}  # request id -> the segment of its line, until booked
        self._ids: Counter[str] = Counter()  # the same, by the id the client sent (attempts together)
        # What goes to disk next, in order: (fd, line) to append, or (fd, path) to remove (a segment
        # is removed after its last line was written: same queue, one thread).
        self._buffer: list[tuple[int, bytes | Path]] = []
        self._waiters: list[asyncio.Future] = []
        self._flushing = False
        self._synced_at_s = float("-inf")  # when the last sync started (the loop's clock)
        self._syncer: _Syncer | None = None
        self._syncer_failed = False  # not started again once it could not be or ended
        self._syncing: tuple[list[int], list[asyncio.Future]] | None = None  # out with the syncer
        # FAIRGATE_JOURNAL_WAIT=write: segments written and not synced yet, and those asked of the syncer
        self._unsynced: set[_Segment] = set()
        self._asked: list[_Segment] = []
        self._sync_timer: asyncio.TimerHandle | None = None
        self._seq = 0
        self._closed = False
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="journal")  # in order: writes, then removals

    def __len__(self) -> int:
        """Settlements kept and not booked yet."""
        return len(self._where)

    def settling(self, request_id: str) -> bool:
        """Whether a request sent with ``request_id`` (any attempt) was served and its settlement
        is kept here, not booked yet: until it is, the ledger cannot tell that the id was used."""
        return request_id in self._ids

    # --- keeping ---

    def keep(self, ask: SettleAsk) -> asyncio.Future:
        """Appends ``ask``; the future is done once its line is on disk (or fails with the OSError).
        Waiting for the write only (FAIRGATE_JOURNAL_WAIT=write, with the syncer), the line is
        written here and now, and the future is done when this returns: the answer's end waits
        for no turn of the event loop (one write per line, a few microseconds, against the two or
        three turns a write at the end of the turn cost every answer)."""
        loop = asyncio.get_running_loop()
        syncer = self._syncer_of(loop)
        segment = self._taking(syncer is not None)
        self._track(ask.request_id, segment)
        segment.lines += 1
        future = loop.create_future()
        if settings.FAIRGATE_JOURNAL_WAIT == "write" and syncer is not None:
            # (Lines wait in the buffer only without a syncer, which never comes back once gone:
            # none is queued ahead of this one.)
            try:
                _append(segment.fd, _line(ask))
            except OSError as failed:
                log.error("could not write the settlement journal: %r", failed)
                future.set_exception(failed)
                return future
            self._unsynced.add(segment)
            self._sync_later(loop)
            future.set_result(None)
            return future
        self._buffer.append((segment.fd, _line(ask)))
        self._waiters.append(future)
        self._soon()
        return future

    def _soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            self._flush_next(asyncio.get_running_loop())

    def _flush_next(self, loop: asyncio.AbstractEventLoop) -> None:
        """The next sync: after this turn (its other lines go along), and no sooner than the
        interval after the last one started. (Answers waiting for the write only: after this turn.)"""
        if self._waits_for_write():
            loop.call_soon(self._flush)
            return
        wait_s = self._synced_at_s + settings.FAIRGATE_JOURNAL_SYNC_INTERVAL_MS / 1000 - loop.time()
        if wait_s > 0:
            loop.call_later(wait_s, self._flush)
        else:
            loop.call_soon(self._flush)

    def _taking(self, syncer: bool) -> _Segment:
        """The segment that takes the next line. A new one's name is put on disk by whoever syncs
        its first lines: the syncer (``syncer``: it syncs the directory of each file it opens), else
        here, before any line of it counts as kept (the thread's fallback). The event loop does not
        wait for a directory sync where it can help it: on a disk the database's WAL shares, one
        costs as long as a file's sync."""
        current = self._current
        if current is not None and current.full():
            self._close_to_lines(current)
            current = None
        if current is None:
            directory = journal_dir()
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"{safe_owner(self.owner)}.{self._next}{SUFFIX}"
            self._next += 1
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not syncer:
                sync_dir(directory)
            current = self._current = _Segment(path, fd, time.monotonic())
            self._segments.append(current)
        return current

    def _track(self, request_id: str, segment: _Segment) -> None:
        before = self._where.get(request_id)
        if before is segment:
            return
        if before is not None:  # kept again (a settlement sent once more): the newer line counts
            self._booked_in(before)
        else:
            self._ids[attempt_of(request_id)] += 1
        self._where[request_id] = segment
        segment.open_asks += 1

    def _flush(self) -> None:
        if self._closed:  # close() writes what is left
            return
        lines, waiters = self._buffer, self._waiters
        self._buffer, self._waiters = [], []
        loop = asyncio.get_running_loop()
        syncer = self._syncer_of(loop)
        if syncer is not None:
            try:
                fds = _write(lines, sync=False)  # to the page cache (microseconds); the syncer syncs
            except OSError as failed:
                self._flushed(failed, waiters)
                return
            if self._waits_for_write():
                self._unsynced.update(segment for segment in self._segments if segment.fd in fds)
                self._flushed(None, waiters)  # the kernel has the lines: no process's death loses them
                self._sync_later(loop)
                return
            self._synced_at_s = loop.time()
            paths = [str(segment.path) for segment in self._segments if segment.fd in fds]
            self._seq += 1
            self._syncing = (fds, waiters)
            syncer.ask(self._seq, paths)  # (if it is gone, `_syncer_ended` syncs them in the thread)
            return
        self._synced_at_s = loop.time()
        written = loop.run_in_executor(self._disk, _write, lines)
        written.add_done_callback(lambda done: self._flushed(done.exception(), waiters))

    def _syncer_of(self, loop: asyncio.AbstractEventLoop) -> _Syncer | None:
        if self._syncer is None and not self._syncer_failed and settings.FAIRGATE_JOURNAL_SYNCER:
            try:
                self._syncer = _Syncer(loop, self._synced, self._syncer_ended)
            except OSError as failed:
                log.warning("could not start the journal's syncer (syncing in a thread): %r", failed)
                self._syncer_failed = True
        return self._syncer

    def _waits_for_write(self) -> bool:
        """Whether an answer's end waits only for its line's write (FAIRGATE_JOURNAL_WAIT=write,
        with the syncer), the sync following apart."""
        return settings.FAIRGATE_JOURNAL_WAIT == "write" and self._syncer is not None

    def _sync_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """The written lines' sync, nobody waiting for it: one out at a time, no sooner than the
        interval after the last one started."""
        if self._asked or self._sync_timer is not None or not self._unsynced:
            return
        wait_s = self._synced_at_s + settings.FAIRGATE_JOURNAL_SYNC_INTERVAL_MS / 1000 - loop.time()
        self._sync_timer = loop.call_later(max(wait_s, 0), self._ask_sync)

    def _ask_sync(self) -> None:
        self._sync_timer = None
        if self._closed or self._asked:
            return
        self._asked = [segment for segment in self._segments if segment in self._unsynced]  # (not removed since)
        self._unsynced.clear()
        if not self._asked:
            return
        self._synced_at_s = asyncio.get_running_loop().time()
        self._seq += 1
        assert self._syncer is not None
        self._syncer.ask(self._seq, [str(segment.path) for segment in self._asked])

    def _take_unsynced(self) -> list[_Segment]:
        """The open segments written and not synced yet (FAIRGATE_JOURNAL_WAIT=write), taken off the
        syncer: their sync, out or put off, is no longer awaited from it."""
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None
        unsynced = [segment for segment in self._segments if segment in self._unsynced or segment in self._asked]
        self._unsynced.clear()
        self._asked = []
        return unsynced

    def _synced(self, error: int) -> None:
        """The syncer's answer to the request out."""
        if self._asked:
            self._asked = []
            if error:  # (not tried again: a failed sync may have lost the pages, and a second one reports nothing)
                log.error("could not sync the settlement journal: %s (booked meanwhile)", os.strerror(error))
            self._sync_later(asyncio.get_running_loop())
            return
        if self._syncing is None:
            return
        _fds, waiters = self._syncing
        self._syncing = None
        self._flushed(OSError(error, os.strerror(error)) if error else None, waiters)

    def _syncer_ended(self) -> None:
        log.warning("the journal's syncer ended; syncing in a thread from now on")
        self._syncer, self._syncer_failed = None, True
        unsynced = self._take_unsynced()
        if unsynced and not self._closed:  # written while answers waited only for the write: synced by the thread
            synced = asyncio.get_running_loop().run_in_executor(self._disk, _sync_with_dir, [s.fd for s in unsynced])
            synced.add_done_callback(_log_failed_sync)
        if self._syncing is not None and not self._closed:
            fds, waiters = self._syncing
            self._syncing = None
            self._sync_in_thread(asyncio.get_running_loop(), fds, waiters)

    def _sync_in_thread(self, loop: asyncio.AbstractEventLoop, fds: list[int], waiters: list[asyncio.Future]) -> None:
        synced = loop.run_in_executor(self._disk, _sync_with_dir, fds)
        synced.add_done_callback(lambda done: self._flushed(done.exception(), waiters))

    def _flushed(self, failed: BaseException | None, waiters: list[asyncio.Future]) -> None:
        if failed is not None:
            log.error("could not write the settlement journal: %r", failed)
        for waiter in waiters:
            if waiter.done():
                continue
            if failed is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(failed)
        if self._buffer and not self._closed:
            self._flush_next(asyncio.get_running_loop())
        else:
            self._flushing = False

    # --- booked ---

    def booked(self, request_id: str) -> None:
        """``request_id``'s settlement is booked (or past help): its line is no longer needed."""
        segment = self._where.pop(request_id, None)
        if segment is not None:
            self._booked_in(segment)
            sent_as = attempt_of(request_id)
            self._ids[sent_as] -= 1
            if not self._ids[sent_as]:
                del self._ids[sent_as]

    def _booked_in(self, segment: _Segment) -> None:
        segment.open_asks -= 1
        if segment.open_asks:
            return
        if segment is self._current and segment.full():
            self._close_to_lines(segment)  # (and removes it)
        elif not segment.taking:
            self._remove(segment)

    def _close_to_lines(self, segment: _Segment) -> None:
        segment.taking = False
        if segment is self._current:
            self._current = None
        if segment.open_asks == 0:
            self._remove(segment)

    def _remove(self, segment: _Segment) -> None:
        if segment in self._segments:
            self._segments.remove(segment)
            self._buffer.append((segment.fd, segment.path))
            self._soon()

    # --- what dead processes left ---

    def adopt(self) -> list[SettleAsk]:
        """Takes over the journals of dead processes on this host (their locks stay held here
        until their settlements are booked); returns the settlements to book."""
        adopted = []
        for path, fd, asks in journals_orphaned():
            segment = _Segment(path, fd, time.monotonic(), lines=len(asks), taking=False)
            self._segments.append(segment)
            fresh = [ask for ask in asks if ask.request_id not in self._where]
            for ask in fresh:
                self._track(ask.request_id, segment)
            if segment.open_asks == 0:
                self._remove(segment)
            adopted += fresh
        return adopted

    def close(self) -> None:
        """At a clean stop: segments whose settlements are all booked are removed; the others stay
        for the next start on this host. (The event loop is stopping: what is left is written here.)"""
        for segment in list(self._segments):
            if segment.open_asks == 0:
                self._remove(segment)
        self._closed = True
        if self._syncer is not None:
            self._syncer.close()
            self._syncer = None
        unsynced = self._take_unsynced()
        self._disk.shutdown(wait=True)
        _sync_all([segment.fd for segment in unsynced])  # written, not synced
        if self._syncing is not None:  # written, its sync not answered: synced here
            _sync_all(self._syncing[0])
            self._waiters[:0] = self._syncing[1]
            self._syncing = None
        _write(self._buffer)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        for segment in self._segments:
            os.close(segment.fd)
        self._segments, self._current, self._where, self._buffer, self._waiters = [], None, {}, [], []
        self._ids.clear()


def _write(ops: list[tuple[int, bytes | Path]], *, sync: bool = True) -> list[int]:
    """Appends the lines (one write and, with ``sync``, one fdatasync per file), then removes the
    segments named; returns the files written."""
    lines: dict[int, list[bytes]] = {}
    removed: list[tuple[int, Path]] = []
    for fd, what in ops:
        if isinstance(what, bytes):
            lines.setdefault(fd, []).append(what)
        else:
            removed.append((fd, what))
    for fd, chunk in lines.items():
        _append(fd, b"".join(chunk))
    if sync:
        _sync_all(list(lines))
    for fd, path in removed:
        unlink_segment(path, fd)
    return list(lines)


def _append(fd: int, data: bytes) -> None:
    """``data`` appended, in one write unless the file takes it in parts."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _log_failed_sync(done: asyncio.Future) -> None:
    if done.exception() is not None:
        log.error("could not sync the settlement journal: %r (booked meanwhile)", done.exception())


def _sync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)


def _sync_with_dir(fds: list[int]) -> None:
    """What a syncer that died was asked: the files, and the directory of a segment it may not
    have opened yet (its name)."""
    sync_dir(journal_dir())
    _sync_all(fds)
