"""Every settlement in a local file before its client gets the last byte: a write-ahead log.

A served request is charged exactly once, whatever process dies. `Journal.keep` appends the
request's settlement (one JSON line) and returns a future; the exchange sends the answer's end
once it is done, and the settlement is booked in the database meanwhile (billing.client), not
on the answer's path. The lines are written by the event loop (to the page cache: each as it is
kept when the answer waits for the write only, else those of one loop turn in one write), and
``fdatasync``'d by the journal's syncer, a small process of its own
(billing/journal_sync.py): each sync costs about 70 us of system time here, and a thread of the
gateway's doing it took the GIL back from the event loop for every one. A sync starts at most
every ``FAIRGATE_JOURNAL_SYNC_INTERVAL_MS`` after the one before (a quiet gateway's line goes at
once), one at a time, so a busy gateway syncs several answers' lines at once (group commit, as the
Booker does for the database).

What the future waits for (``FAIRGATE_JOURNAL_WAIT``):

* ``write`` (the default): the line's write. Once written, the line is the kernel's: a kill of
  any process (the gateway, its worker, both) loses nothing; only the host's own crash (power,
  kernel) before the sync that follows within the interval can. Such a host's holds are released
  by the others' sweep (billing.heartbeats), and finance sees them as released because their
  process was gone: never charged twice, at worst not at all.
* ``sync``: the line's ``fdatasync``. The answer's end then also survives a power loss, at the
  price of the sync's latency on every answer: 0.2 ms on an idle disk here, tens of milliseconds
  while the database's own WAL fsyncs share the disk, which was most of what billing added to the
  gateway's p99 (bench/REPORT-gateway-postgres.md). A streamed answer's tokens reach the client
  before its end either way.

Without the syncer (it could not start, it died, FAIRGATE_JOURNAL_SYNCER=0) a thread of the
journal's own writes and syncs, and answers wait for the sync.

Booking is idempotent per request, so the journal needs no "booked" marks. It is a series of
segment files: the current one takes new lines until it holds ``ROTATE_LINES`` or is
``ROTATE_S`` old; a segment is removed once it takes no more lines and every settlement in it
is booked (or past help). Replaying a segment books each of its settlements once more; one that
was booked is not charged again.

Files: ``FAIRGATE_VAR_DIR/journal/<owner>.<n>.jsonl``, each locked (``flock``) by its live
process; a file whose lock can be taken belongs to a process that is gone. Who books what a
dead process left:

* its billing worker, when the gateway was killed under it: it books its gateway's segments
  before it ends (`journal_replay`, from billing.worker_loop), so the charges land whether or not the
  gateway is started again;
* the next gateway started on the same host, at start (`Journal.adopt`): what the worker could
  not book (both were killed; the database was down).

Why a local file and not Redis: a journal must survive what it guards against, and Redis as
deployed here (and in CI) persists nothing. Why not wait for the database: a commit there is a
round trip through the billing worker and several to the server, on a machine whose cores the
gateway shares with them; an ``fdatasync`` of a few lines is one system call (about 0.1 ms here).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from billing.booking import SettleAsk, attempt_of
from billing.errors import transient
from billing.journal_sync import sync_dir

log = logging.getLogger(__name__)
SUFFIX = ".jsonl"
ROTATE_LINES = 10_000  # a replay books at most about this many settlements once more
ROTATE_S = 10.0


def journal_dir() -> Path:
    return Path(settings.VAR_DIR) / "journal"


def _safe(owner: str) -> str:
    return owner.replace("/", "_")


_FIELDS = tuple(f.name for f in fields(SettleAsk) if f.name != "held")  # replayed, the hold is read from the ledger


assert _FIELDS == ("request_id", "backend_name", "prompt_tokens", "completion_tokens", "at", "base_cost"), _FIELDS
_STR = json.encoder.encode_basestring_ascii  # (json's own string encoder, in C)


def _line(ask: SettleAsk) -> bytes:
    """The journal line of ``ask`` (what `_ask` reads back), written field by field: json.dumps of a
    record took 5-10 us on the event loop for every settlement, this 2."""
    base = "null" if ask.base_cost is None else f'"{ask.base_cost}"'
    return (
        f'{{"settle":{{"request_id":{_STR(ask.request_id)},"backend_name":{_STR(ask.backend_name)},'
        f'"prompt_tokens":{ask.prompt_tokens:d},"completion_tokens":{ask.completion_tokens:d},'
        f'"at":"{ask.at.isoformat()}","base_cost":{base}}}}}\n'
    ).encode()


def _ask(record: dict) -> SettleAsk:
    base = record.get("base_cost")
    return SettleAsk(
        **{
            **record,
            "at": datetime.fromisoformat(record["at"]),
            "base_cost": None if base is None else Decimal(base),
        }
    )


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


class _Syncer:
    """The journal's syncer process (billing/journal_sync.py), asked from the event loop: one
    request out at a time, its answer read by the loop itself (no thread: a thread of the gateway
    would take the GIL back from the event loop for every sync, and the sync's system time would
    be the gateway's). None of this is needed for durability: a syncer that cannot be started or
    that ends hands its work back to the journal's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answered: Callable[[int], None], ended: Callable[[], None]):
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("journal_sync.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._loop, self._answered, self._ended = loop, answered, ended
        self._out = self.process.stdout.fileno()  # type: ignore[union-attr]
        self._in = self.process.stdin.fileno()  # type: ignore[union-attr]
        self._read = b""
        os.set_blocking(self._out, False)
        loop.add_reader(self._out, self._readable)
        self.dead = False

    def ask(self, seq: int, paths: list[str]) -> None:
        """Asks for a sync; answered through ``answered``, or ``ended`` if the syncer is gone."""
        try:  # one short request out at a time: the pipe always takes it whole
            os.write(self._in, json.dumps([seq, paths]).encode() + b"\n")
        except OSError:
            self._die()

    def _readable(self) -> None:
        try:
            data = os.read(self._out, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._die()
            return
        self._read += data
        *lines, self._read = self._read.split(b"\n")
        for line in lines:
            _seq, error = json.loads(line)
            self._answered(error)

    def _die(self) -> None:
        if not self.dead:
            self.dead = True
            self.close()
            self._ended()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.remove_reader(self._out)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


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
                _write([(segment.fd, _line(ask))], sync=False)
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
            path = directory / f"{_safe(self.owner)}.{self._next}{SUFFIX}"
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
        data = memoryview(b"".join(chunk))
        while data:
            data = data[os.write(fd, data) :]
    if sync:
        _sync_all(list(lines))
    for fd, path in removed:
        _unlink(path, fd)
    return list(lines)


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


def _unlink(path: Path, fd: int) -> None:
    path.unlink(missing_ok=True)
    os.close(fd)


def _pending(path: Path) -> list[SettleAsk]:
    kept: dict[str, SettleAsk] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by the crash was never fsync'd as a whole: not promised
            continue
        if "settle" in record:
            ask = _ask(record["settle"])
            kept[ask.request_id] = ask
        elif "done" in record:  # written by versions that marked booked settlements
            kept.pop(record["done"], None)
    return list(kept.values())


def _files(owner: str | None) -> Iterable[Path]:
    directory = journal_dir()
    if not directory.exists():
        return []
    if owner is None:
        return sorted(directory.glob(f"*{SUFFIX}"))
    return sorted(directory.glob(f"{_safe(owner)}.*{SUFFIX}"))


def journals_orphaned(owner: str | None = None) -> list[tuple[Path, int, list[SettleAsk]]]:
    """Journals of processes that are gone (their lock is free), of ``owner`` only if given:
    (path, locked fd, settlements). The caller books them, then calls ``journal_retire``."""
    found = []
    for path in _files(owner):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # retired meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive
            os.close(fd)
            continue
        found.append((path, fd, _pending(path)))
    return found


def journal_retire(path: Path, fd: int) -> None:
    """Every settlement of an orphaned journal is booked: remove it."""
    _unlink(path, fd)


def journal_replay(owner: str, book, *, batch: int = 256) -> tuple[int, int]:
    """Books the journals ``owner`` left (synchronously, with ``book``: billing.booking.book);
    a journal whose settlements were all booked (or are past help) is removed, one with a
    settlement that could not be booked now (the database is out) stays for the next gateway on
    this host. Returns (settlements booked, settlements left)."""
    booked = left = 0
    for path, fd, asks in journals_orphaned(owner):
        kept = False
        for start in range(0, len(asks), batch):
            chunk = asks[start : start + batch]
            try:
                results = book(chunk)
            except Exception as failed:  # the whole chunk: the database is out
                results = [failed] * len(chunk)
            for result in results:
                retry = isinstance(result, BaseException) and transient(result)
                kept |= retry
                left += retry
                booked += not retry
        if kept:
            os.close(fd)
        else:
            journal_retire(path, fd)
    return booked, left
