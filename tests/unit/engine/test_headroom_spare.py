"""Headroom bounded by the lower classes' deadlines (``deadline_share``), and headroom on by default."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.engine import apply_policy
from scheduling.engine.headroom_spare import spare_slots
from scheduling.engine.model import HEADROOM_OFF, HeadroomPolicy
from scheduling.engine.schema import ConfigError, config_from_yaml, config_to_dict
from tests.unit.engine.engine_helpers import config, req, scheduler, submit, with_sla

T = 61_000  # the lower backlogs below began at 0: older than the rate window (a minute)
GUARDED = replace(
    HEADROOM_OFF,
    enabled=True,
    horizon_ms=2000,
    hold_ms=400_000,
    max_slots=4,
    min_expected=0.5,
    recent_ms=5000,
    deadline_share=0.5,
)


def chat_arrivals(sched, start_ms: int, end_ms: int) -> None:
    """INTERACTIVE arriving every 500 ms (the forecast: 2/s), each gone again at once (cancelled)."""
    for t in range(start_ms, end_ms, 500):
        sched.submit(req(f"c{t}", cls="INTERACTIVE", at=t), now_ms=t)
        assert sched.cancel(f"c{t}", now_ms=t)


def busy(policy: HeadroomPolicy, *, slots: int = 10, batch: int = 0, cfg=None, near_rt: int = 0, until: int = T):
    """``slots`` running (``near_rt`` of them NEAR_RT, the rest BATCH ``r*``), ``batch`` BATCH ``b*``
    waiting, all since 0; chat arriving until ``until``."""
    sched = scheduler(replace(cfg or config(), headroom=policy), slots=slots)
    submit(sched, *(req(f"n{i}", cls="NEAR_RT") for i in range(near_rt)))
    submit(sched, *(req(f"r{i}") for i in range(slots - near_rt)))
    assert len(sched.dispatch(now_ms=0)) == slots
    submit(sched, *(req(f"b{i}") for i in range(batch)))
    chat_arrivals(sched, 0, until)
    return sched


def test_a_short_lower_queue_leaves_the_need_as_the_forecast_says():
    sched = busy(GUARDED, batch=6)
    assert busy(replace(GUARDED, deadline_share=0.0), batch=6).headroom_need(now_ms=T) == 4
    assert spare_slots(sched, 0.5, T) == 9  # 10 slots less 6 x 20 s over the 839 s left of 15 min
    assert sched.headroom_need(now_ms=T) == 4


def test_the_holds_get_only_what_the_lower_queue_can_spare():
    sched = busy(GUARDED, batch=330)  # 330 x 20 s = 110 min of work: 7.9 slots to dispatch it in 839 s
    assert spare_slots(sched, 0.5, T) == 2
    assert sched.headroom_need(now_ms=T) == 2


def test_no_hold_while_a_lower_class_is_short():
    sched = busy(GUARDED, batch=500)  # 500 x 20 s in 839 s: 11.9 slots of 10
    assert spare_slots(sched, 0.5, T) == 0 and sched.headroom_need(now_ms=T) == 0
    sched.complete("r0", now_ms=T, prompt_tokens=1, output_tokens=1)
    assert [g.request.id for g in sched.dispatch(now_ms=T)] == ["b0"]  # the freed slot, not held
    unbounded = busy(replace(GUARDED, deadline_share=0.0), batch=500)
    unbounded.complete("r0", now_ms=T, prompt_tokens=1, output_tokens=1)
    assert unbounded.dispatch(now_ms=T) == [] and len(unbounded.headroom_holds()) == 1  # without: held


def test_no_hold_while_a_lower_backlog_is_younger_than_the_rate_window():
    sched = busy(GUARDED, batch=6, until=59_500)
    assert spare_slots(sched, 0.5, 59_999) == 0  # admission is still measuring BATCH's drain
    assert spare_slots(sched, 0.5, 60_000) == 9


def test_slots_run_by_the_classes_above_are_not_spare():
    sched = busy(GUARDED, batch=90, near_rt=5)  # 90 x 20 s in 839 s: 2.1 slots
    assert spare_slots(sched, 0.5, T) == 2  # 10 - 5 run by NEAR_RT - 2.1


def test_holds_go_as_the_oldest_lower_request_nears_its_share_of_the_sla():
    cfg = with_sla(config(), "BATCH", 600_000)  # half of it: 5 minutes
    sched = busy(GUARDED, slots=4, batch=4, cfg=cfg)
    for rid in ("r0", "r1"):  # 61 s each: BATCH's measured service time
        sched.complete(rid, now_ms=T, prompt_tokens=1, output_tokens=1)
    assert sched.dispatch(now_ms=T) == [] and len(sched.headroom_holds()) == 2  # 4 b x 61 s in 239 s: 1 slot
    chat_arrivals(sched, T, 150_000)
    assert sched.dispatch(now_ms=150_000) == [] and len(sched.headroom_holds()) == 2  # 1.6 slots in 150 s
    chat_arrivals(sched, 150_000, 250_000)
    now = 250_000  # 50 s left for 244 s of work: nothing to spare
    assert sched.headroom.forecast.expected(now, 2000, 0.5) > 3  # the forecast still wants the holds
    assert spare_slots(sched, 0.5, now) == 0 and sched.headroom_need(now_ms=now) == 0
    assert [g.request.id for g in sched.dispatch(now_ms=now)] == ["b0", "b1"]  # the holds are released
    assert sched.headroom_holds() == ()


def test_a_lower_request_at_preempt_leaves_nothing_spare():
    cfg = with_sla(config(), "BATCH", 60_000)
    sched = busy(GUARDED, batch=1, cfg=cfg, until=0)
    sched.order.promote(57_000)  # 95 % of its SLA: at preempt
    assert sched._promoted == 1
    assert spare_slots(sched, 0.99, 57_000) == 0


# --- on by default -------------------------------------------------------------------------

YAML = """scheduler:
  classes:
    - {name: INTERACTIVE, level: 0, sla_ms: 3000, price_factor: 1.6}
    - {name: BATCH, level: 2, sla_ms: 60000, price_factor: 0.7}
"""


def test_a_config_without_the_section_gets_headroom_on():
    cfg = config_from_yaml(YAML)
    assert cfg.headroom == HeadroomPolicy()
    assert cfg.headroom.enabled and cfg.headroom.deadline_share == 0.5 and cfg.headroom.rescue_ms == 1500
    assert (cfg.headroom.max_slots, cfg.headroom.hold_ms, cfg.headroom.miss_share) == (12, 16000, 0.015)
    assert "headroom" not in config_to_dict(cfg)  # the defaults are not written out


def test_a_section_without_the_key_gets_the_bound():
    cfg = config_from_yaml(YAML + "  headroom: {enabled: true, max_slots: 5, miss_share: 0}\n")
    assert cfg.headroom.deadline_share == 0.5


def test_headroom_off_round_trips():
    text = YAML + "  headroom: {enabled: false, rescue_ms: 0, deadline_share: 0}\n"
    cfg = config_from_yaml(text)
    assert not cfg.headroom.enabled and cfg.headroom.rescue_ms == 0 and cfg.headroom.deadline_share == 0
    data = config_to_dict(cfg)["headroom"]
    assert data["enabled"] is False and data["deadline_share"] == 0.0


def test_deadline_share_is_checked():
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(YAML + "  headroom: {deadline_share: 1.5}\n")
    assert any(issue.field == "scheduler.headroom.deadline_share" for issue in caught.value.issues)


@pytest.mark.parametrize("policy", ["fifo", "strict", "linear"])
def test_the_presets_keep_the_old_baseline(policy):
    assert apply_policy(config(), policy).headroom == HEADROOM_OFF
    assert not HEADROOM_OFF.enabled and HEADROOM_OFF.rescue_ms == 0 and not HEADROOM_OFF.hold_idle
    assert apply_policy(config(headroom=HeadroomPolicy()), "fairgate").headroom == HeadroomPolicy()
