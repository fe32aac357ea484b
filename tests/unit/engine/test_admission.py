from scheduling.engine import admission as adm
from tests.unit.engine.engine_helpers import backend, config, req, scheduler, submit, tenants, with_sla


def enforcing(**kw):
    """The depth rule's tests: the depth limit enforced, the rule named (the default is ``predicted``)."""
    kw.setdefault("service_ms_prior", 2000)
    kw.setdefault("admission", "depth")
    return config(enforce_depth=True, **kw)


def test_floor_admits_a_burst_after_idle():
    sched = scheduler(enforcing(), slots=64, tenant_specs=tenants(("a", 1.0)))
    # no dispatch in the last 60 s: floor = 64 slots * 3000 ms / 2000 ms = 96
    assert sched.depth_limit("INTERACTIVE", now_ms=0) == 96
    results = [sched.submit(req(f"i{k}", cls="INTERACTIVE", at=0), now_ms=0) for k in range(97)]
    assert all(r.admitted for r in results[:96])
    assert results[96].reason == "queue_full" and results[96].retry_after_ms > 0
    assert sched.counters.classes["INTERACTIVE"].rejected_queue_full == 1
    assert sched.state_of("i96") is None


def test_depth_follows_throughput_and_is_capped():
    sched = scheduler(enforcing(depth_cap=150), slots=1)
    cfg_limit = sched.depth_limit("BATCH", now_ms=0)
    assert cfg_limit == 150  # floor 1 * 1_800_000 / 2000 = 900, capped
    assert adm.depth_limit(dispatched_60s=120, sla_ms=15000, floor=5, cap=1000) == 30
    assert adm.depth_limit(dispatched_60s=0, sla_ms=15000, floor=5, cap=1000) == 5
    assert adm.depth_limit(dispatched_60s=10**6, sla_ms=15000, floor=5, cap=1000) == 1000


def test_measured_throughput_raises_the_limit():
    sched = scheduler(enforcing(service_ms_prior=10**9), slots=4, tenant_specs=tenants(("a", 1.0)))
    # prior service time huge: floor 0 -> limit 1
    assert sched.depth_limit("NEAR_RT", now_ms=0) == 1
    for k in range(40):
        submit(sched, req(f"n{k}", cls="NEAR_RT", at=k * 100))
        for g in sched.dispatch(now_ms=k * 100):
            sched.complete(g.request.id, now_ms=k * 100, prompt_tokens=1, output_tokens=1)
    # 40 dispatches in the window: 40 * 15000 / 60000 = 10, floor from 0 ms service is large
    assert sched.depth_limit("NEAR_RT", now_ms=4000) >= 10
    assert adm.depth_limit(40, 15000, 0, 20000) == 10


def test_floor_shrinks_by_slots_used_by_higher_classes():
    sched = scheduler(enforcing(), slots=10, tenant_specs=tenants(("a", 1.0)))
    before = sched.depth_limit("NEAR_RT", now_ms=0)  # 10 * 15000 / 2000 = 75
    submit(sched, *(req(f"i{k}", cls="INTERACTIVE", at=0) for k in range(6)))
    sched.dispatch(now_ms=0)
    after = sched.depth_limit("NEAR_RT", now_ms=0)
    assert (before, after) == (75, 30)


def test_reserved_slots_count_only_for_the_top_class():
    sched = scheduler(enforcing(), backends=[backend(slots=10, reserved_slots=4)])
    assert sched.depth_limit("INTERACTIVE", now_ms=0) == 10 * 3000 // 2000
    assert sched.depth_limit("NEAR_RT", now_ms=0) == 6 * 15000 // 2000


def test_flooding_tenant_cannot_lock_others_out():
    cfg = with_sla(enforcing(), "NEAR_RT", 4000)  # limit = 2 slots * 4000 / 2000 = 4
    sched = scheduler(cfg, slots=2, tenant_specs=tenants(("flood", 0.5), ("b", 0.25), ("c", 0.25)))
    assert sched.depth_limit("NEAR_RT", now_ms=0) == 4
    flood = [sched.submit(req(f"f{k}", tenant="flood", cls="NEAR_RT"), now_ms=0) for k in range(10)]
    assert sum(r.admitted for r in flood) == 4
    assert sched.submit(req("b0", tenant="b", cls="NEAR_RT"), now_ms=0).admitted  # room 1 = 0.25 * 4
    assert not sched.submit(req("b1", tenant="b", cls="NEAR_RT"), now_ms=0).admitted
    assert sched.submit(req("c0", tenant="c", cls="NEAR_RT"), now_ms=0).admitted
    assert sched.depth("NEAR_RT") == 6 <= 2 * 4


def test_retry_after_from_drain_rate():
    assert adm.retry_after_ms(excess=10, drain_per_ms=0.01, sla_ms=60000) == 1000
    assert adm.retry_after_ms(excess=10, drain_per_ms=0.0, sla_ms=3000) == 3000
    assert adm.retry_after_ms(excess=10**6, drain_per_ms=0.01, sla_ms=3000) == 3000


def test_mean_service_time_replaces_the_prior():
    sched = scheduler(enforcing(service_ms_prior=1000), slots=1, tenant_specs=tenants(("a", 1.0)))
    submit(sched, req("i", cls="INTERACTIVE"))
    sched.dispatch(now_ms=0)
    sched.complete("i", now_ms=3000, prompt_tokens=1, output_tokens=1)
    # floor = 1 slot * 3000 / 3000 = 1; one dispatch in 60 s -> 0 by rate
    assert sched.depth_limit("INTERACTIVE", now_ms=3000) == 1


def test_no_backend_for_model():
    sched = scheduler(config())
    result = sched.submit(req("x", model="unknown"), now_ms=0)
    assert (result.admitted, result.reason) == (False, "no_backend")
    assert sched.counters.classes["BATCH"].rejected_no_backend == 1 and sched.state_of("x") is None


def test_fallback_only_model_admits_vip_only():
    backends = [backend("fb", models=("m",), fallback_for="primary")]
    sched = scheduler(config(), backends=backends)
    assert sched.submit(req("plain"), now_ms=0).reason == "no_backend"
    assert sched.submit(req("vip", vip=True), now_ms=0).admitted


def test_unlimited_when_depth_not_enforced():
    sched = scheduler(config(enforce_depth=False, service_ms_prior=10**9), slots=1)
    assert all(sched.submit(req(f"r{k}", cls="INTERACTIVE"), now_ms=0).admitted for k in range(500))
