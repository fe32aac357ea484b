"""The billing caches: entries expire, and an idle process reloads the ageing ones it uses."""

from __future__ import annotations

import pytest

from billing import cache
from billing.cache import TtlCache, caches_invalidate, caches_refresh_one


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(cache.time, "monotonic", clock)
    return clock


@pytest.fixture
def ttl_cache():
    caches_invalidate()  # the app's caches hold nothing: only this one's entries can be refreshed
    made = TtlCache(ttl_s=1.0)
    yield made
    cache._caches.remove(made)
    caches_invalidate()


def loader(values: list):
    """A load that returns the next of `values` and counts its calls."""
    calls = []

    def load():
        calls.append(1)
        return values[len(calls) - 1]

    return load, calls


def test_an_entry_is_served_until_its_ttl_then_loaded_again(clock, ttl_cache):
    load, calls = loader(["a", "b"])
    assert ttl_cache.get("k", load) == "a"
    clock.now_s += 0.9
    assert ttl_cache.get("k", load) == "a" and len(calls) == 1
    clock.now_s += 0.2
    assert ttl_cache.get("k", load) == "b" and len(calls) == 2


def test_an_ageing_entry_in_use_is_reloaded_while_idle_and_the_next_read_finds_it_fresh(clock, ttl_cache):
    load, calls = loader(["a", "b"])
    ttl_cache.get("k", load)
    clock.now_s += 0.4
    assert caches_refresh_one(older_than_s=0.5) is False  # not yet half its life
    clock.now_s += 0.2
    assert caches_refresh_one(older_than_s=0.5) is True and len(calls) == 2
    clock.now_s += 0.9  # 1.5 s after the first load, 0.9 s after the reload
    assert ttl_cache.get("k", load) == "b" and len(calls) == 2


def test_an_entry_not_read_since_its_load_is_left_to_expire(clock, ttl_cache):
    load, calls = loader(["a", "b", "c"])
    ttl_cache.get("k", load)
    clock.now_s += 0.6
    assert caches_refresh_one(older_than_s=0.5) is True  # read once: reloaded once
    clock.now_s += 0.6
    assert caches_refresh_one(older_than_s=0.5) is False and len(calls) == 2  # an idle process stops here


def test_the_oldest_entry_goes_first(clock, ttl_cache):
    old_load, old_calls = loader(["old", "old2"])
    new_load, new_calls = loader(["new", "new2"])
    ttl_cache.get("old", old_load)
    clock.now_s += 0.3
    ttl_cache.get("new", new_load)
    clock.now_s += 0.6
    assert caches_refresh_one(older_than_s=0.5) is True
    assert (len(old_calls), len(new_calls)) == (2, 1)


def test_an_entry_whose_reload_fails_is_dropped(clock, ttl_cache):
    def broken():
        raise LookupError("gone")

    load, _ = loader(["a"])
    ttl_cache.get("k", load)
    ttl_cache._entries["k"] = ttl_cache._entries["k"].__class__("a", cache._generation, clock.now_s, broken)
    clock.now_s += 0.6
    assert caches_refresh_one(older_than_s=0.5) is True
    assert "k" not in ttl_cache._entries
    with pytest.raises(LookupError):
        ttl_cache.get("k", broken)
