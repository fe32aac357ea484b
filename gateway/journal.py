"""Settlements that could not be booked yet, kept on local disk until they are.

A served request is charged exactly once, even while the database is down: a settlement whose
booking fails is appended here (one JSON line, ``fsync``'d before the client gets its last
byte), retried while the process lives, and marked done once booked. A process killed meanwhile
leaves its file behind; the next gateway started on the same host replays it. Booking is
idempotent per request, so a settlement booked twice (booked, then killed before its done mark
was written) is charged once.

Why a local file and not Redis: a journal must survive what it guards against, and Redis as
deployed here (and in CI) persists nothing. Why only failed settlements: every request already
waits for its own booking before its last byte goes out, so a settlement in flight when the
process dies belongs to an answer the client never completed; only the ones the client was
answered without (the database was down) need the disk, and the hot path pays no ``fsync``.

Files: ``FAIRGATE_VAR_DIR/journal/<owner>.jsonl``, each locked (``flock``) by its live process;
a file whose lock can be taken belongs to a process that is gone.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from django.conf import settings

from billing.booking import SettleAsk

log = logging.getLogger(__name__)
SUFFIX = ".jsonl"


def journal_dir() -> Path:
    return Path(settings.VAR_DIR) / "journal"


def _line(ask: SettleAsk) -> bytes:
    record = {**asdict(ask), "at": ask.at.isoformat()}
    return (json.dumps({"settle": record}, separators=(",", ":")) + "\n").encode()


def _ask(record: dict) -> SettleAsk:
    return SettleAsk(**{**record, "at": datetime.fromisoformat(record["at"])})


class Journal:
    """This process's journal: opened (and locked) on first use."""

    def __init__(self, owner: str) -> None:
        self.path = journal_dir() / f"{owner.replace('/', '_')}{SUFFIX}"
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return self._fd

    def keep(self, asks: list[SettleAsk]) -> None:
        """Durably: on disk when this returns."""
        fd = self._open()
        os.write(fd, b"".join(_line(ask) for ask in asks))
        os.fsync(fd)

    def done(self, request_ids: list[str]) -> None:
        """Booked. (A lost mark costs one idempotent booking more on replay, so no fsync.)"""
        lines = "".join(json.dumps({"done": rid}) + "\n" for rid in request_ids)
        os.write(self._open(), lines.encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
        elif "done" in record:
            kept.pop(record["done"], None)
    return list(kept.values())


def journals_orphaned() -> list[tuple[Path, int, list[SettleAsk]]]:
    """Journals of processes that are gone (their lock is free): (path, locked fd, pending asks).
    The caller books the asks, then calls ``journal_retire``."""
    found = []
    directory = journal_dir()
    for path in sorted(directory.glob(f"*{SUFFIX}")) if directory.exists() else ():
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive
            os.close(fd)
            continue
        found.append((path, fd, _pending(path)))
    return found


def journal_retire(path: Path, fd: int) -> None:
    """Every settlement of an orphaned journal is booked: remove it."""
    path.unlink(missing_ok=True)
    os.close(fd)
