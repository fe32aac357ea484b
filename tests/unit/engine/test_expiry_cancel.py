from scheduling.engine import apply_policy
from tests.unit.engine.engine_helpers import config, drain_order, req, scheduler, submit, with_sla


def test_expires_only_past_the_class_deadline():
    sched = scheduler(config(aging="none"))
    submit(sched, req("i", cls="INTERACTIVE", at=0))
    sched.submit(req("busy", cls="INTERACTIVE", at=0), now_ms=0)
    assert sched.expire(now_ms=3000) == []
    assert [r.id for r in sched.expire(now_ms=3001)] == ["busy", "i"]  # same deadline: by id
    assert sched.state_of("i") is None and sched.dispatch(now_ms=3001) == []
    assert sched.counters.classes["INTERACTIVE"].queue_timeout == 2
    assert sched.depth("INTERACTIVE") == 0


def test_client_deadline_when_earlier():
    sched = scheduler(config(aging="none"))
    submit(sched, req("b", at=0, deadline=500), req("late", at=0, deadline=10**9))
    assert [r.id for r in sched.expire(now_ms=501)] == ["b"]
    assert sched.state_of("late") == "queued"


def test_no_expiry_when_deadlines_not_enforced():
    sched = scheduler(config(aging="none", enforce_deadline=False))
    submit(sched, req("i", cls="INTERACTIVE", at=0, deadline=10))
    assert sched.expire(now_ms=10**8) == []
    assert [g.request.id for g in sched.dispatch(now_ms=10**8)] == ["i"]


def test_expiry_of_a_request_at_preempt():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    submit(sched, req("run", cls="INTERACTIVE", at=0), req("b", at=0))
    sched.dispatch(now_ms=0)
    assert sched.dispatch(now_ms=960) == []  # b promoted but no slot
    assert [r.id for r in sched.expire(now_ms=1001)] == ["b"]
    sched.complete("run", now_ms=1001, prompt_tokens=1, output_tokens=1)
    assert sched.dispatch(now_ms=1001) == []
    assert sched._promoted == 0


def test_cancel_waiting_leaves_at_once():
    sched = scheduler(config(aging="none"))
    submit(sched, *(req(f"b{k}", at=k) for k in range(4)))
    assert sched.cancel("b1", now_ms=5) is True
    assert sched.state_of("b1") is None
    assert drain_order(sched, 6) == ["b0", "b2", "b3"]
    c = sched.counters.classes["BATCH"]
    assert (c.cancelled, c.completed) == (1, 3)


def test_cancel_running_or_unknown_is_false():
    sched = scheduler(config())
    submit(sched, req("x"))
    sched.dispatch(now_ms=0)
    assert sched.cancel("x", now_ms=1) is False and sched.state_of("x") == "running"
    assert sched.cancel("nope", now_ms=1) is False


def test_ignored_cancel_keeps_the_request_queued():
    sched = scheduler(apply_policy(config(), "fifo"))
    submit(sched, req("a"), req("b"))
    assert sched.cancel("b", now_ms=1) is False
    assert sched.state_of("b") == "queued"
    assert drain_order(sched, 2) == ["a", "b"]


def test_next_wakeup_reports_deadline_and_preempt_bound():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    assert sched.next_wakeup_ms(now_ms=0) is None
    submit(sched, req("run", cls="INTERACTIVE", at=0), req("b", at=0))
    sched.dispatch(now_ms=0)
    assert sched.next_wakeup_ms(now_ms=0) == 950  # preempt bound of b
    sched.dispatch(now_ms=950)
    assert sched.next_wakeup_ms(now_ms=950) == 1001  # b's deadline passes


def test_requeue_puts_request_at_front_and_holds_backend():
    sched = scheduler(config(aging="none"))
    submit(sched, req("a0", at=0), req("a1", at=1))
    (g,) = sched.dispatch(now_ms=2)
    sched.requeue("a0", now_ms=3, backend_retry_after_ms=500)
    assert sched.state_of("a0") == "queued"
    assert sched.dispatch(now_ms=100) == []  # backend held
    assert sched.next_wakeup_ms(now_ms=100) == 503
    assert [g.request.id for g in sched.dispatch(now_ms=503)] == ["a0"]
    assert sched.counters.classes["BATCH"].requeued == 1


def test_requests_served_long_before_their_deadline_are_not_kept_for_it():
    """The deadline heap drops dispatched requests lazily; with a 30-minute SLA it held every
    request of the last 30 minutes (memory, and the shared scheduler's snapshot: 17 MB at 13k/s)."""
    sched = scheduler(config(aging="none"), slots=4)
    for k in range(20_000):
        submit(sched, req(f"r{k}", at=k))
        for grant in sched.dispatch(now_ms=k):
            sched.complete(grant.request.id, now_ms=k, prompt_tokens=1, output_tokens=1)
    assert len(sched._deadlines) <= 2 * sched.waiting_count + 1024
    submit(sched, req("late", at=30_000), req("later", at=30_001))  # what waits still expires, in order
    expired = [r.id for r in sched.expire(now_ms=30_000 + 1_800_001 + 1)]
    assert expired[-2:] == ["late", "later"]
