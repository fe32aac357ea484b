"""In-process caches of what billing's hot path reads but rarely changes (prices, backends, budget ids).

Each entry lives at most `CACHE_TTL_S` and is dropped at once when this process changes a row it
was built from (billing.cache_signals bump a generation). `caches_refresh_one` reloads an ageing
entry in an idle moment. Budgets and the price version in force are never trusted to these caches:
billing.booking reads them under lock. More: docs/billing-and-console.md, "Caches".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

CACHE_TTL_S = 1.0
T = TypeVar("T")
_generation = 0
_generation_lock = threading.Lock()
_on_invalidate: list[Callable[[], None]] = []
_caches: list[TtlCache] = []


def caches_invalidate() -> None:
    """Drop every cached entry in this process."""
    global _generation
    with _generation_lock:
        _generation += 1
    for hook in _on_invalidate:
        hook()


def on_invalidate(hook: Callable[[], None]) -> None:
    """Also run `hook` whenever the caches are invalidated (e.g. to clear a memo)."""
    _on_invalidate.append(hook)


@dataclass(frozen=True)
class _Entry(Generic[T]):
    value: T
    generation: int
    loaded_at_s: float
    load: Callable[[], T]


def caches_refresh_one(older_than_s: float = CACHE_TTL_S / 2) -> bool:
    """Reload the oldest entry of this process's caches that is at least `older_than_s` old and was
    read since it was loaded (an idle process stops reloading); whether one was."""
    oldest = min(
        ((found[0], cache, found[1]) for cache in _caches if (found := cache.oldest_read()) is not None),
        default=None,
        key=lambda candidate: candidate[0],
    )
    if oldest is None or time.monotonic() - oldest[0] < older_than_s:
        return False
    _, cache, key = oldest
    cache.reload(key)
    return True


class TtlCache(Generic[T]):
    """key -> value loaded on demand; thread-safe enough for CPython (a race only loads twice)."""

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[Hashable, _Entry[T]] = {}
        self._read: set[Hashable] = set()  # keys read since their entry was loaded
        on_invalidate(self.clear)  # the generation alone would do; this frees the memory
        _caches.append(self)

    def get(self, key: Hashable, load: Callable[[], T], *, refresh: bool = False, read: bool = True) -> T:
        now_s = time.monotonic()
        if read:
            self._read.add(key)
        entry = None if refresh else self._entries.get(key)
        if entry is not None and entry.generation == _generation and now_s - entry.loaded_at_s < self.ttl_s:
            return entry.value
        generation = _generation  # read before loading: a change during the load makes this entry stale
        value = load()
        self._entries[key] = _Entry(value, generation, now_s, load)
        return value

    def oldest_read(self) -> tuple[float, Hashable] | None:
        """(loaded at, key) of the oldest entry read since it was loaded."""
        return min(
            ((self._entries[key].loaded_at_s, key) for key in self._read if key in self._entries),
            default=None,
            key=lambda found: found[0],
        )

    def reload(self, key: Hashable) -> None:
        """Load `key` again now (not a read). An entry whose load fails is dropped: the next `get`
        loads it, and meets the failure, itself."""
        self._read.discard(key)
        try:
            self.get(key, self._entries[key].load, refresh=True, read=False)
        except Exception:
            self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
        self._read.clear()
