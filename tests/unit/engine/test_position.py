import copy
import random

from tests.unit.engine.engine_helpers import config, drain_order, req, scheduler, submit, tenants, with_sla


def brute_force_positions(sched, now_ms):
    replay = copy.deepcopy(sched)
    return {rid: k + 1 for k, rid in enumerate(drain_order(replay, now_ms))}


def test_single_tenant_positions_are_exact_and_fall_as_requests_ahead_leave():
    sched = scheduler(config(aging="none"), slots=1, tenant_specs=tenants(("a", 1.0)))
    submit(sched, *(req(f"r{k}", at=k) for k in range(6)))
    before = sched.position("r5", now_ms=10)
    assert (before.position, before.exact) == (6, True)
    grants = sched.dispatch(now_ms=10)
    mid = sched.position("r5", now_ms=10)
    assert mid.position == 5 and mid.eta_ms > 0
    sched.complete(grants[0].request.id, now_ms=20, prompt_tokens=1, output_tokens=1)
    sched.dispatch(now_ms=20)
    after = sched.position("r5", now_ms=20)
    assert after.position == 4 and after.eta_ms < mid.eta_ms <= before.eta_ms


def test_running_and_unknown_have_no_position():
    sched = scheduler(config())
    submit(sched, req("x"))
    sched.dispatch(now_ms=0)
    assert sched.position("x", now_ms=0) is None and sched.position("ghost", now_ms=0) is None


def test_first_in_line_with_a_free_slot_has_zero_eta():
    sched = scheduler(config(), slots=2)
    submit(sched, req("x"))
    assert sched.position("x", now_ms=0).eta_ms == 0


def test_exact_against_brute_force_single_tenant_many_classes():
    rnd = random.Random(7)
    sched = scheduler(config(aging="none"), slots=2, tenant_specs=tenants(("a", 1.0)))
    classes = ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY")
    for k in range(60):
        submit(sched, req(f"r{k}", cls=rnd.choice(classes), at=k))
    truth = brute_force_positions(sched, 100)
    for rid, position in truth.items():
        answer = sched.position(rid, now_ms=100)
        assert (answer.position, answer.exact) == (position, True), rid


def test_exact_with_requests_at_preempt():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg, slots=1, tenant_specs=tenants(("a", 1.0)))
    submit(sched, req("run", cls="INTERACTIVE", at=0))
    sched.dispatch(now_ms=0)
    submit(sched, req("b0", at=0), req("b1", at=10), req("i0", cls="INTERACTIVE", at=960), req("b2", at=900))
    sched.dispatch(now_ms=960)  # promotes b0 and b1 (ratio >= 0.95)
    sched.complete("run", now_ms=960, prompt_tokens=1, output_tokens=1)
    truth = brute_force_positions(sched, 960)
    assert truth == {"b0": 1, "b1": 2, "i0": 3, "b2": 4}
    for rid, position in truth.items():
        assert sched.position(rid, now_ms=960).position == position


def test_multi_tenant_projection_is_close_and_marked_approximate():
    rnd = random.Random(3)
    sched = scheduler(config(aging="none"), slots=1, tenant_specs=tenants(("a", 0.6), ("b", 0.3), ("c", 0.1)))
    for k in range(90):
        submit(sched, req(f"r{k}", tenant=rnd.choice("abc"), prompt=rnd.randint(50, 150), at=k))
    truth = brute_force_positions(sched, 100)
    errors = []
    for rid, position in truth.items():
        answer = sched.position(rid, now_ms=100)
        assert not answer.exact
        errors.append(abs(answer.position - position))
    assert max(errors) <= 12 and sum(errors) / len(errors) <= 4


def test_cancelled_requests_ahead_are_estimated():
    sched = scheduler(config(aging="none"), slots=1, tenant_specs=tenants(("a", 1.0)))
    submit(sched, *(req(f"r{k}", at=k) for k in range(10)))
    sched.cancel("r2", now_ms=10)
    sched.cancel("r3", now_ms=10)
    answer = sched.position("r9", now_ms=10)
    assert answer.position == 8 and not answer.exact


def test_boosted_lanes_make_the_answer_approximate():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg, slots=1, tenant_specs=tenants(("a", 1.0)))
    submit(sched, req("b", at=0), req("i", cls="INTERACTIVE", at=700))
    assert not sched.position("i", now_ms=700).exact
