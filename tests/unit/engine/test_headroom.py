"""Predictive headroom: the arrival forecast, bounded holds of freed slots, configuration."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from scheduling.engine import apply_policy
from scheduling.engine.forecast import DAY_MS, ArrivalForecast
from scheduling.engine.headroom import turnover_bound
from scheduling.engine.model import HEADROOM_OFF, HeadroomPolicy
from scheduling.engine.schema import ConfigError, config_from_dict, config_from_yaml, config_to_dict, config_to_yaml
from scheduling.engine.snapshot import from_record, to_record
from tests.unit.engine.engine_helpers import config, req, scheduler, submit

MINUTE = 60_000
NOW = 11_000
# the section's pre-default keys (no hold_idle, miss_share, rescue or deadline bound) with these values
HEADROOM = replace(
    HEADROOM_OFF, enabled=True, horizon_ms=2000, hold_ms=1000, max_slots=2, min_expected=0.5, recent_ms=5000
)


def headroom_config(policy: HeadroomPolicy = HEADROOM):
    return replace(config(), headroom=policy)


# --- the forecast --------------------------------------------------------------------------


def test_profile_learns_a_bucket_per_day_and_skips_the_partial_first_one():
    forecast = ArrivalForecast(bucket_ms=5 * MINUTE, alpha=0.5, recent_ms=MINUTE)
    for t in range(2 * MINUTE, 5 * MINUTE, 1000):  # a partial first bucket: not learned
        forecast.observe(t)
    for t in range(5 * MINUTE, 10 * MINUTE, 1000):  # 300 arrivals in bucket 1
        forecast.observe(t)
    forecast.observe(10 * MINUTE)  # closes bucket 1
    assert forecast.profile[0] is None
    assert forecast.profile[1] == 300.0
    for t in range(DAY_MS + 5 * MINUTE, DAY_MS + 10 * MINUTE, 2000):  # the next day: 150 in the same bucket
        forecast.observe(t)
    forecast.observe(DAY_MS + 10 * MINUTE)
    assert forecast.profile[1] == pytest.approx(225.0)  # 300 + 0.5 x (150 - 300)
    assert forecast.profile[3] == 0.0  # a bucket that passed without arrivals learned 0


def test_profile_rate_interpolates_between_bucket_centres():
    forecast = ArrivalForecast(bucket_ms=1000 * 60, alpha=1.0, recent_ms=MINUTE)
    forecast.profile[0], forecast.profile[1] = 60.0, 120.0
    assert forecast.profile_rate(30_000) == pytest.approx(1 / 1000)  # centre of bucket 0
    assert forecast.profile_rate(60_000) == pytest.approx(1.5 / 1000)  # halfway to bucket 1's centre
    assert forecast.profile_rate(DAY_MS + 90_000) == pytest.approx(2 / 1000)  # the next day: same phase
    assert forecast.profile_rate(10 * MINUTE) is None  # no day has covered it


def test_recent_rate_decays_and_blends_with_the_profile():
    forecast = ArrivalForecast(bucket_ms=5 * MINUTE, alpha=0.5, recent_ms=1000)
    forecast.observe(0)
    assert forecast.recent_rate(0) == pytest.approx(1 / 1000)
    assert forecast.recent_rate(1000) == pytest.approx(1 / 1000 / 2.718281828, rel=1e-6)
    assert forecast.rate_per_ms(0, 2000, 0.5) == forecast.recent_rate(0)  # no profile yet: recent only
    forecast.profile[0] = forecast.profile[1] = 300.0  # 1 per s
    assert forecast.rate_per_ms(0, 2000, 0.5) == pytest.approx(0.5 / 1000 + 0.5 / 1000)
    assert forecast.expected(0, 2000, 1.0) == pytest.approx(2.0)


def test_bucket_must_divide_a_day():
    with pytest.raises(ValueError):
        ArrivalForecast(bucket_ms=7 * MINUTE, alpha=0.5, recent_ms=MINUTE)


# --- holds -----------------------------------------------------------------------------------


def chatted_pool(policy: HeadroomPolicy, slots: int):
    """INTERACTIVE arriving every 500 ms until 10 s (a forecast of 2/s recently), each served at
    once; at 11 s six BATCH requests waiting."""
    sched = scheduler(headroom_config(policy), slots=slots)
    for i, t in enumerate(range(0, 10_000, 500)):
        sched.submit(req(f"i{i}", cls="INTERACTIVE", at=t), now_ms=t)
        for g in sched.dispatch(now_ms=t):
            sched.complete(g.request.id, now_ms=t, prompt_tokens=1, output_tokens=1)
    submit(sched, *(req(f"b{i}", at=NOW) for i in range(6)))
    return sched


def busy_pool(policy: HeadroomPolicy = HEADROOM):
    """`chatted_pool` of two slots, both then held by BATCH with more BATCH waiting."""
    sched = chatted_pool(policy, 2)
    assert [g.request.id for g in sched.dispatch(now_ms=NOW)] == ["b0", "b1"]  # the last holds ended at 10.5 s
    return sched


def test_a_freed_slot_is_held_for_the_top_class_then_granted_at_the_holds_end():
    sched = busy_pool()
    now = NOW
    assert sched.headroom_need(now_ms=now) == 2
    sched.complete("b0", now_ms=now, prompt_tokens=1, output_tokens=1)
    assert sched.dispatch(now_ms=now) == []  # held: BATCH waits
    assert sched.headroom_holds() == (now + 1000,)
    assert sched.next_wakeup_ms(now_ms=now) == now + 1000  # the driver looks again at the hold's end
    grants = sched.dispatch(now_ms=now + 999)
    assert grants == []
    grants = sched.dispatch(now_ms=now + 1000)
    assert [g.request.id for g in grants] == ["b2"]  # at its end the slot goes to BATCH
    assert sched.headroom_holds() == ()
    assert sched.held_slot_ms == 1000


def test_a_top_class_request_takes_the_held_slot_at_once():
    sched = busy_pool()
    now = NOW
    sched.complete("b0", now_ms=now, prompt_tokens=1, output_tokens=1)
    sched.dispatch(now_ms=now)
    sched.submit(req("late", cls="INTERACTIVE", at=now + 200), now_ms=now + 200)
    grants = sched.dispatch(now_ms=now + 200)
    assert [(g.request.id, g.waited_ms) for g in grants] == [("late", 0)]
    assert sched.headroom_holds() == ()  # used up
    assert sched.held_slot_ms == 200


def test_no_hold_without_forecast_demand():
    sched = busy_pool()
    now = NOW + 10 * MINUTE  # the recent rate has decayed, no profile yet
    assert sched.headroom_need(now_ms=now) == 0
    sched.complete("b0", now_ms=now, prompt_tokens=1, output_tokens=1)
    assert [g.request.id for g in sched.dispatch(now_ms=now)] == ["b2"]  # in the same dispatch step


def test_holds_beyond_the_need_are_released_at_the_next_dispatch():
    sched = busy_pool()
    now = NOW
    sched.complete("b0", now_ms=now, prompt_tokens=1, output_tokens=1)
    sched.dispatch(now_ms=now)
    sched.reconfigure(now_ms=now + 10, config=headroom_config(replace(HEADROOM, min_expected=50.0)))
    assert [g.request.id for g in sched.dispatch(now_ms=now + 10)] == ["b2"]


def idle_pool(policy: HeadroomPolicy):
    """`chatted_pool` of four slots: at 11 s all four are idle."""
    return chatted_pool(policy, 4)


def test_without_hold_idle_a_batch_burst_takes_every_idle_slot():
    sched = idle_pool(HEADROOM)
    assert sched.headroom_need(now_ms=NOW) == 2
    assert len(sched.dispatch(now_ms=NOW)) == 4
    assert sched.headroom_holds() == ()


def test_with_hold_idle_a_batch_burst_onto_an_idle_pool_leaves_the_need_held():
    sched = idle_pool(replace(HEADROOM, hold_idle=True))
    assert [g.request.id for g in sched.dispatch(now_ms=NOW)] == ["b0", "b1"]
    assert sched.headroom_holds() == (NOW + 1000, NOW + 1000)
    sched.submit(req("chat", cls="INTERACTIVE", at=NOW + 100), now_ms=NOW + 100)
    assert [(g.request.id, g.waited_ms) for g in sched.dispatch(now_ms=NOW + 100)] == [("chat", 0)]
    assert sched.headroom_holds() == (NOW + 1000,)


def test_with_hold_idle_a_hold_that_ends_is_not_renewed():
    sched = idle_pool(replace(HEADROOM, hold_idle=True))
    sched.dispatch(now_ms=NOW)
    assert sched.headroom_need(now_ms=NOW + 1000) == 2  # still wanted
    grants = sched.dispatch(now_ms=NOW + 1000)  # both holds end: their slots go to BATCH
    assert [g.request.id for g in grants] == ["b2", "b3"]
    assert sched.headroom_holds() == ()
    assert sched.held_slot_ms == 2000


def test_holds_and_forecast_survive_a_snapshot():
    sched = busy_pool()
    sched.complete("b0", now_ms=NOW, prompt_tokens=1, output_tokens=1)
    copy = from_record(msgpack.unpackb(msgpack.packb(to_record(sched))))
    assert copy.headroom_holds() == sched.headroom_holds()
    assert copy.headroom_need(now_ms=NOW) == sched.headroom_need(now_ms=NOW)


@pytest.mark.parametrize("policy", ["fifo", "strict", "linear"])
def test_presets_turn_headroom_off(policy):
    cfg = apply_policy(headroom_config(), policy)
    assert cfg.headroom == HEADROOM_OFF
    assert apply_policy(headroom_config(), "fairgate").headroom == HEADROOM


def test_headroom_off_grants_at_once():
    sched = busy_pool(HEADROOM_OFF)
    sched.complete("b0", now_ms=NOW, prompt_tokens=1, output_tokens=1)
    assert [g.request.id for g in sched.dispatch(now_ms=NOW)] == ["b2"]
    assert sched.headroom_need(now_ms=NOW) == 0


# --- configuration ---------------------------------------------------------------------------

YAML = """scheduler:
  classes:
    - {name: INTERACTIVE, level: 0, sla_ms: 3000, price_factor: 1.6}
    - {name: BATCH, level: 2, sla_ms: 60000, price_factor: 0.7}
"""


def test_headroom_section_round_trips_next_to_aging():
    config = config_from_yaml(YAML + "  headroom: {enabled: true, max_slots: 3, hold_ms: 2500}\n")
    assert config.headroom == HeadroomPolicy(enabled=True, max_slots=3, hold_ms=2500)
    data = config_to_dict(config)
    assert list(data)[:4] == ["policy", "classes", "aging", "headroom"]
    assert data["headroom"] == {"enabled": True, "hold_ms": 2500, "max_slots": 3}
    assert config_from_yaml(config_to_yaml(config)) == config
    assert config_from_dict(data) == config
    assert "headroom" not in config_to_dict(config_from_yaml(YAML))


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("{bucket_ms: 420000}", "bucket_ms"),
        ("{profile_weight: 1.5}", "profile_weight"),
        ("{min_expected: 0}", "min_expected"),
        ("{hold_ms: 0}", "hold_ms"),
        ("{enabled: 1}", "enabled"),
        ("{holds: 2}", "holds"),
    ],
)
def test_headroom_section_is_checked(section, field):
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(YAML + f"  headroom: {section}\n")
    assert any(issue.field == f"scheduler.headroom.{field}" for issue in caught.value.issues)


# --- the turnover bound (miss_share) ---------------------------------------------------------


def missed_share(turnover: float, held: int) -> float:
    """The birth-death chain's share of arrivals that find no slot held (the module's docstring)."""
    return (turnover - 1) / (turnover ** (held + 1) - 1)


def test_the_turnover_bound_is_the_fewest_holds_that_keep_the_miss_share():
    assert turnover_bound(2.0, 0.05) == 4  # 1/31 = 3.2% missed with 4 held; 1/15 = 6.7% with 3
    assert missed_share(2.0, 4) <= 0.05 < missed_share(2.0, 3)
    assert turnover_bound(10.0, 0.5) == 1  # never fewer than one
    assert turnover_bound(1.0, 0.01) is None and turnover_bound(0.5, 0.01) is None  # frees no faster: no bound
    assert turnover_bound(1.25, 0.01) > turnover_bound(1.5, 0.01) > turnover_bound(3.0, 0.01)  # slower pools hold more


def turning_pool(policy: HeadroomPolicy):
    """Eight slots; for 10 s an INTERACTIVE request every 500 ms (2/s) and three BATCH requests
    beside each, all served at once and done: slots free at 8/s, four times as fast as chat arrives."""
    sched = scheduler(headroom_config(policy), slots=8)
    for i, t in enumerate(range(0, 10_000, 500)):
        sched.submit(req(f"i{i}", cls="INTERACTIVE", at=t), now_ms=t)
        submit(sched, *(req(f"x{i}-{k}", at=t) for k in range(3)))
        for g in sched.dispatch(now_ms=t):
            sched.complete(g.request.id, now_ms=t, prompt_tokens=1, output_tokens=1)
    return sched


def test_a_pool_that_turns_over_fast_holds_no_more_than_its_turnover_needs():
    policy = replace(HEADROOM, max_slots=10, miss_share=0.05)
    plain = turning_pool(replace(policy, miss_share=0.0))
    sched = turning_pool(policy)
    now = 10_000
    assert plain.headroom_need(now_ms=now) == 4  # about 2/s x 2 s expected: 4 (the forecast alone)
    turnover = sched.free_rate(now) * policy.horizon_ms / sched.headroom.forecast.expected(now, policy.horizon_ms, 0.5)
    assert turnover == pytest.approx(4.0)
    assert sched.headroom_need(now_ms=now) == turnover_bound(turnover, 0.05) == 2  # 3/63 = 4.8% missed with 2 held


def test_miss_share_is_in_the_yaml_and_checked():
    config = config_from_yaml(YAML + "  headroom: {enabled: true, miss_share: 0.01}\n")
    assert config.headroom.miss_share == 0.01 and config_to_dict(config)["headroom"]["miss_share"] == 0.01
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(YAML + "  headroom: {miss_share: 1.5}\n")
    assert any(issue.field == "scheduler.headroom.miss_share" for issue in caught.value.issues)
    assert apply_policy(headroom_config(replace(HEADROOM, miss_share=0.01)), "strict").headroom == HEADROOM_OFF
