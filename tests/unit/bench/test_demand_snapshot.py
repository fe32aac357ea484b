"""bench.demand_snapshot measures what it says: the learned profile's keys, and the snapshot's bytes
with it against without it (the difference is the profile's record packed alone)."""

from __future__ import annotations

from bench.demand_snapshot import measure


def test_the_profile_is_what_the_snapshot_gains():
    r = measure(waiting=10, rounds=1, days=1)
    assert r["keys"] == 20 * 4 + 4 and r["waiting"] == 10
    assert r["with_bytes"] - r["without_bytes"] == r["alone_bytes"] - 1  # its None in the bare one: one byte
    assert r["alone_bytes"] > 84 * 288 * 9  # a 9-byte float per bucket and key
