"""Finished requests, kept for GET /v1/queue/{id}: bounded in count and in age.

Kept in two insertion-ordered dicts (record by key, time by key) rather than one of
``(time, record)`` tuples: a tuple holding a dict stays tracked by the garbage collector
forever, and at the default 100,000 records every full collection would walk them all
(the records, keys and times themselves are untracked)."""

from __future__ import annotations

from collections import OrderedDict


class TerminalLog:
    def __init__(self, *, keep_ms: int, max_entries: int) -> None:
        self.keep_ms = keep_ms
        self.max_entries = max_entries
        self._records: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._added_ms: OrderedDict[tuple[str, str], int] = OrderedDict()  # same keys, same order
        self._jobs: dict[str, dict[str, dict[str, None]]] = {}  # tenant -> job -> public ids (records' "job")

    def add(self, tenant: str, public_id: str, record: dict, *, now_ms: int) -> None:
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
