"""Finished requests, kept for GET /v1/queue/{id}: bounded in count and in age.

Kept in two insertion-ordered dicts (record by key, time by key) rather than one of
``(time, record)`` tuples: a tuple holding a dict stays tracked by the garbage collector
forever, and at the default 100,000 records every full collection would walk them all
(the records, keys and times themselves are untracked). A record must hold plain values only
(text, numbers, None): one holding an object, such as an outcome's enum member, is tracked, and
with 100,000 of them every full collection walked them all; measured, a gateway's CPU per
request rose by a quarter as the log filled. `add` keeps such values as their text."""

from __future__ import annotations

import gc
from collections import OrderedDict
from enum import Enum


class TerminalLog:
    def __init__(self, *, keep_ms: int, max_entries: int) -> None:
        self.keep_ms = keep_ms
        self.max_entries = max_entries
        self._records: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._added_ms: OrderedDict[tuple[str, str], int] = OrderedDict()  # same keys, same order
        self._jobs: dict[str, dict[str, dict[str, None]]] = {}  # tenant -> job -> public ids (records' "job")

    def add(self, tenant: str, public_id: str, record: dict, *, now_ms: int) -> None:
        if gc.is_tracked(record):  # a value that is an object (an enum member): kept as its text
            record = _plain(record)
        key = (tenant, public_id)
        self._drop(key)
        self._added_ms.pop(key, None)
        self._records[key] = record
        self._added_ms[key] = now_ms
        if record.get("job"):
            self._jobs.setdefault(tenant, {}).setdefault(record["job"], {})[public_id] = None
        self._prune(now_ms)

    def jobs_of(self, tenant: str, *, now_ms: int) -> dict[str, list[dict]]:
        """The tenant's finished records by job (the console's job cards)."""
        self._prune(now_ms)
        return {
            job: [self._records[(tenant, public_id)] for public_id in ids]
            for job, ids in self._jobs.get(tenant, {}).items()
        }

    def _drop(self, key: tuple[str, str]) -> None:
        record = self._records.pop(key, None)
        job = None if record is None else record.get("job")
        jobs = self._jobs.get(key[0]) if job else None
        if jobs is None or job is None:
            return
        ids = jobs.get(job, {})
        ids.pop(key[1], None)
        if not ids:
            jobs.pop(job, None)
            if not jobs:
                del self._jobs[key[0]]

    def get(self, tenant: str, public_id: str, *, now_ms: int) -> dict | None:
        self._prune(now_ms)
        return self._records.get((tenant, public_id))

    def _prune(self, now_ms: int) -> None:
        added_ms = self._added_ms
        while added_ms and (len(added_ms) > self.max_entries or next(iter(added_ms.values())) <= now_ms - self.keep_ms):
            key, _ = added_ms.popitem(last=False)
            self._drop(key)

    def __len__(self) -> int:
        return len(self._records)


def _plain(record: dict) -> dict:
    return {key: (value.value if isinstance(value, Enum) else value) for key, value in record.items()}
