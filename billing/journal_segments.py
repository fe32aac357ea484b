"""The settlement journal's segment files (billing.journal): where they are, their line format,
and booking those a dead process left (`journals_orphaned`, `journal_replay`)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from billing.booking_asks import SettleAsk
from billing.errors import transient

SUFFIX = ".jsonl"


def journal_dir() -> Path:
    return Path(settings.VAR_DIR) / "journal"


def safe_owner(owner: str) -> str:
    return owner.replace("/", "_")


_FIELDS = tuple(name for name in SettleAsk._fields if name != "held")  # replayed, the hold is read from the ledger


assert _FIELDS == ("request_id", "backend_name", "prompt_tokens", "completion_tokens", "at", "base_cost"), _FIELDS
_STR = json.encoder.encode_basestring_ascii  # (json's own string encoder, in C)


def line_of(ask: SettleAsk) -> bytes:
    """The journal line of ``ask`` (what `ask_of` reads back), written field by field: json.dumps of a
    record took 5-10 us on the event loop for every settlement, this 2."""
    base = "null" if ask.base_cost is None else f'"{ask.base_cost}"'
    return (
        f'{{"settle":{{"request_id":{_STR(ask.request_id)},"backend_name":{_STR(ask.backend_name)},'
        f'"prompt_tokens":{ask.prompt_tokens:d},"completion_tokens":{ask.completion_tokens:d},'
        f'"at":"{ask.at.isoformat()}","base_cost":{base}}}}}\n'
    ).encode()


def ask_of(record: dict) -> SettleAsk:
    base = record.get("base_cost")
    return SettleAsk(
        **{
            **record,
            "at": datetime.fromisoformat(record["at"]),
            "base_cost": None if base is None else Decimal(base),
        }
    )


def unlink_segment(path: Path, fd: int) -> None:
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
            ask = ask_of(record["settle"])
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
    return sorted(directory.glob(f"{safe_owner(owner)}.*{SUFFIX}"))


def journals_orphaned(
    owner: str | None = None, *, busy: list[Path] | None = None
) -> list[tuple[Path, int, list[SettleAsk]]]:
    """Journals of processes that are gone (their lock is free), of ``owner`` only if given:
    (path, locked fd, settlements). The caller books them, then calls ``journal_retire``. Those
    whose lock is still held are appended to ``busy`` if given."""
    found = []
    for path in _files(owner):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # retired meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive, or not quite gone
            os.close(fd)
            if busy is not None:
                busy.append(path)
            continue
        found.append((path, fd, _pending(path)))
    return found


def journal_retire(path: Path, fd: int) -> None:
    """Every settlement of an orphaned journal is booked: remove it."""
    unlink_segment(path, fd)


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


def journals_locked(owner: str) -> int:
    """How many of ``owner``'s journals are still locked (its process alive, or not quite gone)."""
    busy: list[Path] = []
    for _path, fd, _asks in journals_orphaned(owner, busy=busy):
        os.close(fd)  # free: not this question's
    return len(busy)
