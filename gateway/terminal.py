"""Finished requests, kept for GET /v1/queue/{id}: bounded in count and in age."""
from __future__ import annotations

from collections import OrderedDict


class TerminalLog:
    def __init__(self, *, keep_ms: int, max_entries: int) -> None:
        self.keep_ms = keep_ms
        self.max_entries = max_entries
        self._items: OrderedDict[tuple[str, str], tuple[int, dict]] = OrderedDict()

    def add(self, tenant: str, public_id: str, record: dict, *, now_ms: int) -> None:
        key = (tenant, public_id)
        self._items.pop(key, None)
        self._items[key] = (now_ms, record)
        self._prune(now_ms)

    def get(self, tenant: str, public_id: str, *, now_ms: int) -> dict | None:
        self._prune(now_ms)
        hit = self._items.get((tenant, public_id))
        return None if hit is None else hit[1]

    def _prune(self, now_ms: int) -> None:
        items = self._items
        while items and (len(items) > self.max_entries or next(iter(items.values()))[0] <= now_ms - self.keep_ms):
            items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
