from dataclasses import replace

import pytest

from scheduling.engine import FairnessMode, apply_policy
from tests.unit.engine.engine_helpers import CLASSES, config, drain_order, req, scheduler, submit, tenants, with_sla


def waiting_ids(sched):
    return sorted(r.id for r in sched.waiting())


def test_new_sla_applies_to_waiting_requests():
    sched = scheduler(config(aging="none"))
    submit(sched, req("run", at=0), req("b", at=0))
    sched.dispatch(now_ms=0)
    assert sched.expire(now_ms=5000) == []
    sched.reconfigure(now_ms=5000, config=with_sla(config(aging="none"), "BATCH", 4000))
    assert [r.id for r in sched.expire(now_ms=5000)] == ["b"]


def test_new_sla_moves_the_preempt_bound():
    sched = scheduler(config(), slots=1)
    submit(sched, req("run", cls="INTERACTIVE", at=0), req("b", at=0))
    sched.dispatch(now_ms=0)
    assert sched.next_wakeup_ms(now_ms=1) == int(0.95 * 1_800_000)
    sched.reconfigure(now_ms=1, config=with_sla(config(), "BATCH", 10_000))
    assert sched.next_wakeup_ms(now_ms=1) == 9500


def test_new_weights_change_future_picks():
    sched = scheduler(config(aging="none"), tenant_specs=tenants(("a", 0.5), ("b", 0.5)))
    submit(sched, *(req(f"a{k}", tenant="a") for k in range(20)), *(req(f"b{k}", tenant="b") for k in range(20)))
    sched.reconfigure(now_ms=0, tenants=tenants(("a", 0.9), ("b", 0.1)))
    first = drain_order(sched, 1)[:20]
    assert sum(x.startswith("a") for x in first) == 18


def test_fairness_mode_change_keeps_every_request_in_tenant_order():
    sched = scheduler(config(aging="none"))
    submit(sched, *(req(f"r{k}", tenant="ab"[k % 2], at=k) for k in range(10)))
    sched.dispatch(now_ms=10)
    before = waiting_ids(sched)
    sched.reconfigure(now_ms=10, config=config(aging="none", fairness=FairnessMode.FIFO))
    assert waiting_ids(sched) == before
    sched.complete("r0", now_ms=11, prompt_tokens=1, output_tokens=1)
    assert drain_order(sched, 11) == [f"r{k}" for k in range(1, 10)]


def test_switch_to_single_queue_and_back():
    sched = scheduler(config())
    submit(sched, *(req(f"r{k}", cls=("BATCH", "INTERACTIVE")[k % 2], at=k) for k in range(6)))
    sched.reconfigure(now_ms=6, config=apply_policy(config(), "fifo"))
    sched.reconfigure(now_ms=6, config=config())
    assert drain_order(sched, 7) == ["r1", "r3", "r5", "r0", "r2", "r4"]


def test_removed_class_keeps_its_requests_served():
    sched = scheduler(config(aging="none"))
    submit(sched, req("run", cls="INTERACTIVE"), req("retry", cls="RETRY", at=1))
    sched.dispatch(now_ms=1)
    sched.reconfigure(now_ms=2, config=replace(config(aging="none"), classes=CLASSES[:3]))
    assert sched.state_of("retry") == "queued"
    with pytest.raises(ValueError):
        sched.submit(req("new", cls="RETRY", at=3), now_ms=3)
    sched.complete("run", now_ms=3, prompt_tokens=1, output_tokens=1)
    assert [g.request.id for g in sched.dispatch(now_ms=3)] == ["retry"]
    sched.complete("retry", now_ms=4, prompt_tokens=1, output_tokens=1)
    assert sched.counters.classes["RETRY"].completed == 1 and "RETRY" not in sched._retired


def test_depth_cap_change_applies():
    sched = scheduler(config(enforce_depth=True, depth_cap=1000), slots=20)  # floor 1800
    assert sched.depth_limit("BATCH", now_ms=0) == 1000
    sched.reconfigure(now_ms=0, config=config(enforce_depth=True, depth_cap=3))
    assert sched.depth_limit("BATCH", now_ms=0) == 3


def test_preempt_stage_requests_survive_a_rebuild():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    submit(sched, req("run", cls="INTERACTIVE"), req("b", at=0), req("i", cls="INTERACTIVE", at=960))
    sched.dispatch(now_ms=0)
    sched.position("b", now_ms=960)  # promotes b
    sched.reconfigure(now_ms=960, config=cfg)
    sched.complete("run", now_ms=960, prompt_tokens=1, output_tokens=1)
    assert [(g.request.id, g.preempt) for g in sched.dispatch(now_ms=960)] == [("b", True)]


def test_completion_after_a_rebuild_still_corrects_the_counter():
    sched = scheduler(config(aging="none"))
    submit(sched, req("a0", tenant="a"))
    sched.dispatch(now_ms=0)
    sched.reconfigure(now_ms=1, config=config(aging="none"))  # BATCH lane had no waiting: gone
    sched.complete("a0", now_ms=2, prompt_tokens=100, output_tokens=5000)
    submit(sched, *(req(f"b{k}", tenant="b", at=3) for k in range(5)), req("a1", tenant="a", at=3))
    assert drain_order(sched, 3)[-1] == "a1"  # a's 5000 extra output tokens were charged
