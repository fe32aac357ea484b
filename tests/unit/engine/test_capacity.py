from scheduling.engine import TenantSpec
from tests.unit.engine.engine_helpers import backend, config, req, scheduler, submit


def ids(grants):
    return [g.request.id for g in grants]


def test_slots_bound_concurrency():
    sched = scheduler(config(aging="none"), slots=2)
    submit(sched, req("a"), req("b"), req("c"))
    assert ids(sched.dispatch(now_ms=0)) == ["a", "b"]
    assert sched.dispatch(now_ms=1) == []
    sched.complete("a", now_ms=2, prompt_tokens=1, output_tokens=1)
    assert ids(sched.dispatch(now_ms=2)) == ["c"]


def test_reserved_slots_for_top_class_and_vip_only():
    tenant_specs = [TenantSpec("a", 0.5), TenantSpec("boss", 0.5, vip=True)]
    sched = scheduler(config(aging="none"), backends=[backend(slots=3, reserved_slots=1)], tenant_specs=tenant_specs)
    submit(sched, *(req(f"b{k}", cls="BATCH") for k in range(3)))
    assert ids(sched.dispatch(now_ms=0)) == ["b0", "b1"]  # third slot is reserved
    submit(sched, req("vip", tenant="boss", cls="BATCH", at=1))
    assert ids(sched.dispatch(now_ms=1)) == ["vip"]
    sched.complete("vip", now_ms=2, prompt_tokens=1, output_tokens=1)
    submit(sched, req("chat", cls="INTERACTIVE", at=2))
    assert ids(sched.dispatch(now_ms=2)) == ["chat"]
    assert sched.state_of("b2") == "queued"


def test_tpm_window_blocks_then_reopens():
    sched = scheduler(config(aging="none"), backends=[backend(slots=10, tpm=1000)])
    submit(sched, *(req(f"r{k}", prompt=200, out=200) for k in range(3)))  # 400 tokens estimated each
    assert ids(sched.dispatch(now_ms=0)) == ["r0", "r1"]
    assert sched.dispatch(now_ms=59_999) == []
    assert sched.next_wakeup_ms(now_ms=59_999) == 60_000
    assert ids(sched.dispatch(now_ms=60_000)) == ["r2"]


def test_tpm_estimate_reconciled_with_actual_tokens():
    sched = scheduler(config(aging="none"), backends=[backend(slots=10, tpm=1000)])
    submit(sched, *(req(f"r{k}", prompt=200, out=200) for k in range(3)))
    sched.dispatch(now_ms=0)
    sched.complete("r0", now_ms=10, prompt_tokens=150, output_tokens=10)  # 160 instead of 400
    assert ids(sched.dispatch(now_ms=10)) == ["r2"]


def test_request_bigger_than_tpm_passes_an_empty_window():
    sched = scheduler(config(aging="none"), backends=[backend(slots=2, tpm=100)])
    submit(sched, req("huge", prompt=5000, out=5000), req("next", prompt=1, out=1))
    assert ids(sched.dispatch(now_ms=0)) == ["huge"]


def test_rpm_window():
    sched = scheduler(config(aging="none"), backends=[backend(slots=10, rpm=2)])
    submit(sched, *(req(f"r{k}") for k in range(3)))
    assert ids(sched.dispatch(now_ms=0)) == ["r0", "r1"]
    assert sched.dispatch(now_ms=30_000) == []
    assert ids(sched.dispatch(now_ms=60_000)) == ["r2"]


def test_429_hold_closes_only_that_backend():
    sched = scheduler(config(aging="none"), backends=[backend("g1", slots=1), backend("g2", slots=1)])
    submit(sched, req("a"), req("b"), req("c"))
    grants = sched.dispatch(now_ms=0)
    assert [(g.request.id, g.backend) for g in grants] == [("a", "g1"), ("b", "g2")]
    sched.requeue("a", now_ms=1, backend_retry_after_ms=1000)
    sched.complete("b", now_ms=2, prompt_tokens=1, output_tokens=1)
    assert [(g.request.id, g.backend) for g in sched.dispatch(now_ms=2)] == [("a", "g2")]
    assert sched.dispatch(now_ms=3) == []  # g1 still held
    assert [(g.request.id, g.backend) for g in sched.dispatch(now_ms=1001)] == [("c", "g1")]


def test_vip_fallback_only_when_primary_exhausted():
    backends = [backend("primary", slots=1), backend("spare", slots=5, fallback_for="primary")]
    tenant_specs = [TenantSpec("a", 0.5), TenantSpec("boss", 0.5, vip=True)]
    sched = scheduler(config(aging="none"), backends=backends, tenant_specs=tenant_specs)
    submit(sched, req("v1", tenant="boss"))
    assert [g.backend for g in sched.dispatch(now_ms=0)] == ["primary"]
    submit(sched, req("plain", tenant="a", at=1), req("v2", tenant="boss", at=2))
    assert [(g.request.id, g.backend) for g in sched.dispatch(now_ms=2)] == [("v2", "spare")]
    assert sched.state_of("plain") == "queued"


def test_most_free_backend_wins_and_disabled_is_skipped():
    backends = [backend("small", slots=1), backend("large", slots=4), backend("off", slots=50, enabled=False)]
    sched = scheduler(config(aging="none"), backends=backends)
    submit(sched, *(req(f"r{k}") for k in range(5)))
    assert [g.backend for g in sched.dispatch(now_ms=0)] == ["large", "large", "large", "small", "large"]


def test_removed_backend_drains_running_requests():
    sched = scheduler(config(aging="none"), backends=[backend("old", slots=1)])
    submit(sched, req("r0"), req("r1"))
    sched.dispatch(now_ms=0)
    sched.reconfigure(now_ms=1, backends=[backend("new", slots=1)])
    sched.complete("r0", now_ms=2, prompt_tokens=1, output_tokens=1)  # on the removed backend
    assert [(g.request.id, g.backend) for g in sched.dispatch(now_ms=2)] == [("r1", "new")]
    assert "old" not in sched._capacity.states
