from scheduling.engine import FairnessMode, apply_policy
from tests.unit.engine.engine_helpers import backend, config, drain_order, req, scheduler, submit, with_sla


def test_lower_level_first_without_aging():
    sched = scheduler(config(aging="none"))
    submit(
        sched,
        req("r", cls="RETRY", at=0),
        req("b", cls="BATCH", at=1),
        req("n", cls="NEAR_RT", at=2),
        req("i", cls="INTERACTIVE", at=3),
    )
    assert drain_order(sched, 10) == ["i", "n", "b", "r"]


def test_fifo_within_class_and_tenant():
    sched = scheduler(config(aging="none"))
    submit(sched, *(req(f"b{k}", at=k) for k in range(5)))
    assert drain_order(sched, 10) == [f"b{k}" for k in range(5)]


def test_aging_lifts_a_class_over_a_higher_one_only_past_the_bound():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    submit(sched, req("old_batch", cls="BATCH", at=0), req("chat", cls="INTERACTIVE", at=890))
    # BATCH ratio 0.9 -> boost 1.98 < 2 levels: INTERACTIVE still first
    grants = sched.dispatch(now_ms=900)
    assert [g.request.id for g in grants] == ["chat"] and not grants[0].boosted


def test_aging_boost_wins_and_is_flagged():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    submit(sched, req("old_batch", cls="BATCH", at=0), req("chat", cls="INTERACTIVE", at=920))
    # BATCH ratio 0.93 -> boost 2.65 > 2 levels
    grants = sched.dispatch(now_ms=930)
    assert [(g.request.id, g.boosted, g.preempt) for g in grants] == [("old_batch", True, False)]
    assert sched.counters.classes["BATCH"].boosted == 1


def test_preempt_is_edf_across_classes_with_level_tiebreak():
    cfg = with_sla(with_sla(config(), "INTERACTIVE", 1000), "NEAR_RT", 4000)
    cfg = with_sla(cfg, "BATCH", 10000)
    sched = scheduler(cfg)
    submit(
        sched,
        req("b1", cls="BATCH", at=0),
        req("b2", cls="BATCH", at=0, deadline=9980),
        req("r1", cls="RETRY", at=9000),
        req("n1", cls="NEAR_RT", at=5970),
        req("i1", cls="INTERACTIVE", at=8990),
        req("i4", cls="INTERACTIVE", at=9000),
        req("i2", cls="INTERACTIVE", at=9960),
    )
    order = []
    while grants := sched.dispatch(now_ms=9960):
        g = grants[0]
        order.append((g.request.id, g.preempt))
        sched.complete(g.request.id, now_ms=9960, prompt_tokens=1, output_tokens=1)
    # Classes in EDF order of their promoted requests (n1 9970, b2 9980, i1 9990, i4 10000); the
    # BATCH slot goes to its fair pick, tenant a's FIFO head b1, before b2 of the same tenant.
    assert order == [("n1", True), ("b1", True), ("b2", True), ("i1", True), ("i4", True), ("i2", False), ("r1", False)]
    assert sched.counters.total("preempted") == 5


def test_preempt_gives_the_class_the_slot_and_fairness_picks_the_tenant():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    # a's request is at preempt, but a has been served a lot; b's younger request is the fair pick.
    submit(
        sched, req("a_old", tenant="a", at=0), req("b_new", tenant="b", at=900), req("chat", cls="INTERACTIVE", at=950)
    )
    lane = sched._lanes[("BATCH", "m")]
    lane.adjust(lane.tenants["a"], 10_000)
    order = []
    while grants := sched.dispatch(now_ms=960):
        order += [(g.request.id, g.preempt) for g in grants]
        for g in grants:
            sched.complete(g.request.id, now_ms=960, prompt_tokens=1, output_tokens=1)
    assert order == [("b_new", True), ("a_old", True), ("chat", False)]


def test_winning_class_serves_its_fair_pick_not_its_oldest():
    cfg = with_sla(config(), "BATCH", 1000)
    sched = scheduler(cfg)
    submit(sched, req("a1", tenant="a", at=0), req("a2", tenant="a", at=1), req("b1", tenant="b", at=800))
    assert [g.request.id for g in sched.dispatch(now_ms=800)] == ["a1"]  # tie on counters: earlier head
    submit(sched, req("chat", cls="INTERACTIVE", at=925))
    sched.complete("a1", now_ms=930, prompt_tokens=100, output_tokens=100)
    # BATCH is lifted by a2 (ratio 0.929) but serves b1 (b's counter is lower)
    grants = sched.dispatch(now_ms=930)
    assert [(g.request.id, g.boosted) for g in grants] == [("b1", True)]


def test_full_model_does_not_block_other_models():
    backends = [backend("g1", slots=1, models=("m1",)), backend("g2", slots=1, models=("m2",))]
    sched = scheduler(config(), backends=backends)
    submit(sched, req("x", cls="INTERACTIVE", model="m1", at=0))
    assert [g.backend for g in sched.dispatch(now_ms=0)] == ["g1"]
    submit(sched, req("y", cls="INTERACTIVE", model="m1", at=1), req("z", cls="RETRY", model="m2", at=2))
    grants = sched.dispatch(now_ms=3)
    assert [(g.request.id, g.backend) for g in grants] == [("z", "g2")]
    assert sched.state_of("y") == "queued"


def test_dispatch_fills_all_free_slots_in_policy_order():
    sched = scheduler(config(aging="none"), slots=3)
    submit(
        sched,
        req("b", cls="BATCH", at=0),
        req("r", cls="RETRY", at=0),
        req("i", cls="INTERACTIVE", at=1),
        req("n", cls="NEAR_RT", at=2),
    )
    assert [g.request.id for g in sched.dispatch(now_ms=5)] == ["i", "n", "b"]
    assert sched.dispatch(now_ms=6) == []


def test_single_queue_is_one_global_fifo():
    cfg = apply_policy(config(), "fifo")
    assert cfg.fairness.mode == FairnessMode.FIFO
    sched = scheduler(cfg)
    submit(
        sched,
        req("b", cls="BATCH", tenant="a", at=0),
        req("r", cls="RETRY", tenant="b", at=1),
        req("i", cls="INTERACTIVE", tenant="b", at=2),
    )
    assert drain_order(sched, 10_000_000) == ["b", "r", "i"]


def test_strict_preset_never_ages():
    cfg = apply_policy(with_sla(config(), "BATCH", 1000), "strict")
    sched = scheduler(cfg)
    submit(sched, req("b", cls="BATCH", at=0), req("i", cls="INTERACTIVE", at=990))
    assert drain_order(sched, 999) == ["i", "b"]


def test_linear_preset_boosts_by_ratio_without_preempt():
    cfg = apply_policy(with_sla(config(), "NEAR_RT", 1000), "linear")
    sched = scheduler(cfg)
    # NEAR_RT (level 1) at ratio 1.5 -> 1 - 1.5 < INTERACTIVE fresh (0 - 0)
    submit(sched, req("n", cls="NEAR_RT", at=0), req("i", cls="INTERACTIVE", at=1500))
    grants = sched.dispatch(now_ms=1500)
    assert [(g.request.id, g.preempt, g.boosted) for g in grants] == [("n", False, True)]


def test_deterministic_same_inputs_same_grants():
    def run():
        sched = scheduler(config(), slots=2)
        for k in range(40):
            sched.submit(
                req(f"r{k}", tenant="ab"[k % 2], cls=("BATCH", "INTERACTIVE", "NEAR_RT")[k % 3], at=k, prompt=10 * k),
                now_ms=k,
            )
        return drain_order(sched, 100)

    assert run() == run()
