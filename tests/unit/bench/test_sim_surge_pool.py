"""The simulator's copy of the live surge replay's pool, its window figures and the stock model
(the runs themselves are benchmarks, not tests)."""

from __future__ import annotations

from bench import sim_surge_pool as pool


def test_the_pool_is_the_replays_at_its_load_scale():
    raw = pool.pool_raw(24, {"max_slots": 5})
    assert raw["backends"][0]["slots"] == 24
    chat, near_rt, batch = raw["generators"]
    assert len(chat["tenant"]) == 19 and "finance" not in chat["tenant"]
    assert round(chat["rate_per_s"] * len(chat["tenant"]), 3) == 1.41  # half of 2.82/s
    assert round(near_rt["rate_per_s"] * len(near_rt["tenant"]), 3) == 0.62
    assert batch["count"] == 6200 and batch["at_ms"] == pool.WARMUP_MS and batch["tenant"] == "finance"
    assert chat["service_ms"] == {"base_ms": 474, "per_output_token_ms": 40.0}  # 150 ms per 512 tokens, 25 tokens/s
    assert raw["config"]["headroom"]["max_slots"] == 5 and raw["config"]["headroom"]["enabled"] is True
    assert pool.pool_raw(48)["generators"][2]["count"] == 12_400


def test_windows_are_by_send_time_from_nine_to_the_drain():
    sent = [(pool.WARMUP_MS - 10, 9_000)]  # before 09:00: not counted
    sent += [(pool.WARMUP_MS + 1_000 * i, 100 * i) for i in range(1, 21)]  # 09:00-09:05, waits 0.1-2 s
    sent += [(pool.WARMUP_MS + pool.STEP_MS + 1_000 * i, 0) for i in range(1, 6)]  # 09:05-09:10
    sent += [(pool.WARMUP_MS + 2 * pool.STEP_MS + 1_000 * i, 5_000) for i in range(1, 6)]  # after the drain
    windows = pool.window_p95s(sent, pool.WARMUP_MS + 2 * pool.STEP_MS)
    assert windows == {"09:05": 1_900, "09:10": 0}


def test_the_stock_model_trades_idle_slots_for_waits():
    rows = [pool.stock(24, holds, 600) for holds in range(6)]
    assert rows[0]["idle_slots"] == 0
    assert all(a["waits_longer"] > b["waits_longer"] for a, b in zip(rows, rows[1:]))
    assert all(a["idle_slots"] < b["idle_slots"] < b["holds"] for a, b in zip(rows, rows[1:]))
    # a bigger pool turns over faster per chat waiting, so the same holds leave fewer long waits
    assert pool.stock(48, 3, 600)["waits_longer"] < pool.stock(24, 3, 600)["waits_longer"]
