import pytest

from scheduling.engine import FairnessMode, TenantSpec
from scheduling.engine.fairness import tenant_weights
from tests.unit.engine.engine_helpers import config, drain_order, req, scheduler, submit, tenants

WFT, WRR = FairnessMode.WEIGHTED_FAIR_TOKENS, FairnessMode.WEIGHTED_ROUND_ROBIN


def test_weights_floor_and_renormalise():
    weights, unknown = tenant_weights([TenantSpec("big", 0.9), TenantSpec("tiny", 0.001)], 0.02)
    assert weights["big"] == pytest.approx(0.9 / 0.92)
    assert weights["tiny"] == pytest.approx(0.02 / 0.92)
    assert sum(weights.values()) == pytest.approx(1.0)
    assert unknown == pytest.approx(0.02 / 0.92)


def test_wft_shares_by_weight():
    sched = scheduler(config(aging="none"), tenant_specs=tenants(("a", 0.75), ("b", 0.25)))
    submit(
        sched,
        *(req(f"a{k}", tenant="a", at=k) for k in range(40)),
        *(req(f"b{k}", tenant="b", at=k) for k in range(40)),
    )
    first = drain_order(sched, 100)[:40]
    assert sum(x.startswith("a") for x in first) == 30


def test_wft_counts_tokens_not_requests():
    sched = scheduler(config(aging="none"))
    submit(
        sched,
        *(req(f"big{k}", tenant="a", prompt=1000, out=1000, at=k) for k in range(10)),
        *(req(f"small{k}", tenant="b", prompt=100, out=100, at=k) for k in range(40)),
    )
    first = drain_order(sched, 100)[:22]
    assert sum(x.startswith("big") for x in first) == 2


def test_wrr_counts_requests():
    sched = scheduler(config(aging="none", fairness=WRR))
    submit(
        sched,
        *(req(f"big{k}", tenant="a", prompt=1000, out=1000, at=k) for k in range(10)),
        *(req(f"small{k}", tenant="b", prompt=100, out=100, at=k) for k in range(10)),
    )
    first = drain_order(sched, 100)[:10]
    assert sum(x.startswith("big") for x in first) == 5


def test_fifo_mode_ignores_tenants():
    sched = scheduler(config(aging="none", fairness=FairnessMode.FIFO))
    submit(sched, *(req(f"a{k}", tenant="a", at=k) for k in range(5)), req("b0", tenant="b", at=10))
    assert drain_order(sched, 100) == ["a0", "a1", "a2", "a3", "a4", "b0"]


def serve(sched, count, now_ms):
    served = []
    for _ in range(count):
        (grant,) = sched.dispatch(now_ms=now_ms)
        r = grant.request
        sched.complete(r.id, now_ms=now_ms, prompt_tokens=r.prompt_tokens, output_tokens=r.expected_output_tokens)
        served.append(r.id)
    return served


def test_returning_tenant_counter_is_lifted_so_idle_time_is_no_credit():
    sched = scheduler(config(aging="none"))
    submit(sched, req("b_early", tenant="b", at=0), *(req(f"a{k}", tenant="a", at=0) for k in range(20)))
    assert serve(sched, 11, 0)[0] == "b_early"  # then b idles while a is served alone
    submit(sched, *(req(f"b{k}", tenant="b", at=10) for k in range(10)))
    order = serve(sched, 6, 10)
    assert sum(x.startswith("a") for x in order) == 3  # alternation, not a run of b


def test_actual_usage_corrects_the_counter():
    sched = scheduler(config(aging="none"))
    submit(
        sched, *(req(f"a{k}", tenant="a", at=0) for k in range(5)), *(req(f"b{k}", tenant="b", at=0) for k in range(5))
    )
    (g,) = sched.dispatch(now_ms=1)
    assert g.request.id == "a0"
    sched.complete("a0", now_ms=2, prompt_tokens=100, output_tokens=2000)  # far above the 100 expected
    assert drain_order(sched, 3)[:4] == ["b0", "b1", "b2", "b3"]


def test_failed_request_is_refunded_in_wft():
    sched = scheduler(config(aging="none"))
    submit(
        sched,
        req("a0", tenant="a", at=0),
        req("a1", tenant="a", at=0),
        req("b0", tenant="b", at=0),
        req("b1", tenant="b", at=0),
    )
    (g,) = sched.dispatch(now_ms=1)
    sched.fail(g.request.id, now_ms=2)
    assert sched.dispatch(now_ms=3)[0].request.id == "a1"  # a is charged nothing for a0


def test_unknown_tenant_is_served_at_min_share():
    sched = scheduler(config(aging="none", min_share=0.1), tenant_specs=tenants(("a", 0.9)))
    submit(
        sched,
        *(req(f"a{k}", tenant="a", at=0) for k in range(30)),
        *(req(f"x{k}", tenant="stranger", at=0) for k in range(30)),
    )
    first = drain_order(sched, 1)[:20]
    assert sum(x.startswith("x") for x in first) == 2
