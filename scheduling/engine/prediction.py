"""Prediction: admission by predicted dispatch time, and early fast-fail of hopeless requests.

One model for both: how many requests must start before a request can (``must``), and how fast its
class, or its tenant, starts them (``Drain``). :class:`Prediction` is a part of the engine; it reads
the engine's counts, rates and service means, keeps no state of its own, and uses
:class:`~scheduling.engine.evidence.Evidence` for what the rates cannot tell. The model, the rules
and why they are so: docs/engine.md, "Prediction".
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import TYPE_CHECKING, NamedTuple

from . import admission as adm
from .class_plans import ClassPlan
from .counters import TenantInClass
from .evidence import Evidence
from .foreseen import foreseen_refusal
from .outcomes import Admission
from .queues import compact_age, unqueue
from .store import WAITING, Ticket

if TYPE_CHECKING:
    from .fairness import Lane, TenantQueue
    from .scheduler import Scheduler

FAST_FAIL_EVERY_MS = 250  # the fast-fail check runs at most this often (when expire runs)
MISS_RISK = 0.05  # the chance of missing its deadline that admission accepts for a request on a short horizon
SHARE_RISK = 0.01  # the chance of missing its deadline admission accepts for a backlogged tenant's request
UNKNOWN_MS = math.inf  # backlog start of a class whose requests were found in the store at start-up
STALE_VISITS = 256  # stale age-heap entries a count of those due at preempt may step over before compacting


class Drain(NamedTuple):
    """What the model knows of one class's draining at one instant."""

    rate_per_ms: float  # R for admission: the lower measured rate, or the assumption
    fail_rate_per_ms: float  # R for fast-fail: the highest measured rate, or the assumption if higher
    preempt_rate_per_ms: float  # P: the class's rate once its requests outrank every other class
    measured: bool  # the rates are measured (else assumed)


class Prediction:
    """The prediction model over the engine's state: admission's refusal and limit, the predicted
    wait, and the fast-fail check (``refusal``, ``limit``, ``predicted_wait_ms``, ``fast_fail``)."""

    def __init__(self, engine: Scheduler) -> None:
        self.engine = engine
        self.evidence = Evidence(engine)

    # ------------------------------------------------------------------ the model
    def _higher_waiting(self, plan: ClassPlan) -> int:
        depth, waiting = self.engine._depth_by_cls, 0
        for name in self.engine._higher[plan.spec.name]:
            waiting += depth.get(name, 0)
        return waiting

    def _lower_at_preempt(self, cls: str, until_ms: float, cap: float) -> int:
        """``L``: waiting requests of lower classes at preempt, or reaching it by ``until_ms`` (the
        preempt stage serves them before every request that is not), counted up to ``cap``."""
        engine, count = self.engine, 0
        for lower in engine._lower[cls]:
            if engine._plans[lower].preempt_wait_ms is None:
                continue
            for lane in engine._class_lanes.get(lower, ()):
                count += lane.promoted
                age = lane.age
                if count < cap and lane.live > lane.promoted and age and age[0][0] <= until_ms:
                    count += _due_by(lane, until_ms, cap - count)
                if count >= cap:
                    return count
        return count

    def _service_now(self, name: str) -> float:
        """``service_ms(name)``, read directly (the hot path of predicted admission)."""
        mean, prior = self.engine._cls_service.get(name), self.engine._config.queue.service_ms_prior
        return mean.value(prior) if mean is not None else float(prior)

    def _usable_slots(self, plan: ClassPlan) -> int:
        capacity = self.engine._capacity
        return capacity.total_slots - (0 if plan.privileged else capacity.total_reserved)

    def _free_now(self, usable: int) -> int:
        return max(0, usable - sum(self.engine._running_by_cls.values()))

    def _ahead(self, cls: str, tenant: str, extra: int) -> float:
        """``min(Q, k / w)`` with ``extra`` (1 for a new request) added to both counts."""
        in_class = self.engine._depth_by_cls.get(cls, 0) + extra
        if not self.engine._fair_lanes:
            return in_class
        own = self.engine._book(cls, tenant).waiting + extra
        return min(in_class, own / self.engine._tenant_weight.get(tenant, self.engine._unknown_weight))

    def _drain(self, plan: ClassPlan, usable: int, now_ms: int, *, for_fail: bool = False) -> Drain:
        """The class's rates (``for_fail``: the fast-fail rate also counts the assumption)."""
        name = plan.spec.name
        since = self.engine._backlog_since.get(name)
        if since == UNKNOWN_MS:  # found waiting at start-up: its backlog counts from the first look
            since = self.engine._backlog_since[name] = now_ms
        # the mean service time: for admission's assumption, the slower of its value now and at the
        # backlog's first prediction (a burst's first completions are its shortest); else its value now
        live_ms = slow_ms = self._service_now(name)
        if since is not None:
            start = self.engine._backlog_service.get(name)
            if start is None or start[0] != since:  # this backlog's first look (inf: no completion yet)
                unknown = bool(self.engine._prior_weight) and name not in self.engine._cls_service
                start = self.engine._backlog_service[name] = (since, math.inf if unknown else live_ms)
            slow_ms = max(live_ms, start[1])
        elif self.engine._prior_weight and name not in self.engine._cls_service:  # never served, and nothing waits
            slow_ms = math.inf
        if slow_ms == math.inf:
            slow_ms = self.evidence.unknown_service_ms(name, now_ms)
        if since is not None and since <= now_ms - adm.WINDOW_MS:
            recent = plan.dispatch_rate.count(now_ms) / adm.WINDOW_MS
            dispatched = self.engine.counters.for_class(name).dispatched - self.engine._backlog_base[name]
            backlog = dispatched / (now_ms - since)
            high = max(recent, backlog, self._assumed_rate(name, usable, live_ms, now_ms) if for_fail else 0.0)
            return Drain(min(recent, backlog), high, max(high, usable / live_ms), True)
        rate = self._assumed_rate(name, usable, slow_ms, now_ms)
        return Drain(rate, rate, max(rate, usable / live_ms), False)

    def _assumed_rate(self, name: str, usable: int, service_ms: float, now_ms: int) -> float:
        """``(S - O - L) / service_ms + sum(L_c / service_c)`` (docs/engine.md, "Prediction")."""
        services, prior = self.engine._cls_service, self.engine._config.queue.service_ms_prior
        busy_ms = 0.0  # slot-ms higher classes took over the window: over it, the slots they hold (Little's law)
        for window, higher in self.engine._higher_rates[name]:
            dispatched = window.count(now_ms)
            if dispatched:
                mean = services.get(higher)
                busy_ms += dispatched * (mean.value(prior) if mean is not None else prior)
        held = busy_ms / adm.WINDOW_MS
        freed = 0.0  # slots lower classes hold now come back at their own pace, each once
        running = self.engine._running_by_cls
        for lower in self.engine._lower[name]:
            count = running.get(lower)
            if count:
                mean = services.get(lower)
                held += count
                freed += count / (mean.value(prior) if mean is not None else prior)
        return max(0.0, usable - held) / service_ms + freed

    def predicted_wait_ms(self, cls: str, tenant: str, *, now_ms: int) -> float:
        """The model's wait for a new request of ``tenant`` in ``cls`` at ``now_ms``: ``must / R``,
        or its tenant's own ``k / R_u`` when that is measured and longer (inf: not draining).
        Computed whatever the configured admission; the measured rates need prediction on (the
        engine tracks backlogs only then), else it is the assumption."""
        plan = self.engine._plans[cls]
        usable = self._usable_slots(plan)
        free = self._free_now(usable)
        must = self._higher_waiting(plan) + self._ahead(cls, tenant, 1) - free
        if must <= 0:
            return 0.0
        rate = self._drain(plan, usable, now_ms).rate_per_ms
        wait_ms = (must + self._fresh_deficit(cls, free, must / rate, now_ms)) / rate if rate > 0 else math.inf
        book = self.engine._book(cls, tenant)
        tenant_rate = self._tenant_drain(book, now_ms)
        if tenant_rate is not None:
            wait_ms = max(wait_ms, (book.waiting + 1) / tenant_rate if tenant_rate > 0 else math.inf)
        return wait_ms

    # ------------------------------------------------------------------ admission
    def _fresh_deficit(self, cls: str, free: int, horizon_ms: float, now_ms: int) -> float:
        """``G``: the starts a rate ``R`` over-counts within ``horizon_ms`` because the slots the
        class fills are fresh (docs/engine.md, *fresh slots*)."""
        service_ms = self._service_now(cls)
        if horizon_ms <= 0 or service_ms <= 0:
            return 0.0
        cap = min(0.5, horizon_ms / service_ms)
        deficit = max(0, free) * cap
        running = self.engine._running_by_cls.get(cls, 0)
        if running > 0:
            age_ms = now_ms - self.engine._started_sum.get(cls, 0) / running
            deficit += running * min(cap, max(0.0, 0.5 - age_ms / service_ms))
        return deficit

    def refusal(
        self, plan: ClassPlan, book: TenantInClass, tenant: str, deadline_ms: int, now_ms: int
    ) -> Admission | None:
        """None when the model admits a new request of ``tenant`` (its ``book`` in the class; rules in
        docs/engine.md)."""
        cls = plan.spec.name
        depth = self.engine._depth_by_cls.get(cls, 0)
        capacity = self.engine._capacity
        usable = capacity.total_slots - (0 if plan.privileged else capacity.total_reserved)
        free = max(0, usable - sum(self.engine._running_by_cls.values()))
        base = self._higher_waiting(plan) - free  # H - F
        if depth < self.engine._depth_cap and base + depth + 1 <= 0:
            return None  # a slot is free for it
        drain = self._drain(plan, usable, now_ms)
        rate = drain.rate_per_ms
        if depth >= self.engine._depth_cap:
            return _queue_full(depth - self.engine._depth_cap + 1, rate, plan)
        left_ms = max(0, deadline_ms - now_ms)
        if self.engine.demand is not None:
            foreseen = foreseen_refusal(self, plan, book, tenant, left_ms, usable, rate, now_ms)
            if foreseen is not None:
                return foreseen if isinstance(foreseen, Admission) else None
        after_ms = self.evidence.after_ms(cls, drain.measured, left_ms)
        kept_ms = self.evidence.kept_ms(left_ms, after_ms)  # what a predicted wait may take of it
        own_ms = kept_ms  # of it, what the tenant's own drain may take
        lower = self._lower_at_preempt(cls, now_ms + kept_ms, rate * kept_ms + free + 1)
        if lower:  # lower classes' requests at preempt by then go first: as if waiting in a higher class
            base += lower
            own_ms = max(0.0, kept_ms - lower / rate) if rate > 0 else 0.0
        tenant_rate = None if book.since_ms is None else self._tenant_drain(book, now_ms)
        if tenant_rate is not None:
            if book.waiting + 1 > tenant_rate * own_ms:
                return _queue_full(book.waiting + 1 - tenant_rate * own_ms, tenant_rate, plan)
            if not self._share_likely(plan, book.waiting + 1, tenant_rate, left_ms - (kept_ms - own_ms), now_ms):
                return _queue_full(1, tenant_rate, plan)
        share = (
            (book.waiting + 1) / self.engine._tenant_weight.get(tenant, self.engine._unknown_weight)
            if self.engine._fair_lanes
            else 0.0
        )
        if self.engine._fair_lanes:
            slack_ms = left_ms - kept_ms
            if base + share + self._fresh_deficit(cls, free, slack_ms, now_ms) <= rate * slack_ms:
                return self._unlikely(
                    cls, base + share, free, rate, left_ms, now_ms, after_ms
                )  # its share of the slack
        horizon_ms = kept_ms
        excess = base + depth + 1 + self._fresh_deficit(cls, free, horizon_ms, now_ms) - rate * horizon_ms
        if excess <= 0 and self.engine._fair_lanes:  # it fits its own deadline: does it fit those it may overtake?
            promised_ms = self._earliest_promise_ms(cls, tenant, depth + 1)
            if promised_ms is not None and promised_ms < deadline_ms:
                horizon_ms = self.evidence.kept_ms(max(0, promised_ms - now_ms), after_ms)
                excess = base + depth + 1 + self._fresh_deficit(cls, free, horizon_ms, now_ms) - rate * horizon_ms
        if excess > 0:
            return _queue_full(excess, rate, plan)
        must = base + (min(depth + 1, share) if self.engine._fair_lanes else depth + 1)
        return self._unlikely(cls, must, free, rate, left_ms, now_ms, after_ms)

    def _unlikely(
        self, cls: str, must: float, free: int, rate: float, left_ms: int, now_ms: int, after_ms: int = 0
    ) -> Admission | None:
        """A ``queue_full`` when the wait fits on average but a slot-turnover count as likely as not
        reaching ``must`` by the deadline is too likely (docs/engine.md, *chance*); else None."""
        if (left_ms >= self._service_now(cls) and left_ms > after_ms) or must <= 0:
            return None  # the slots turn over more than once: the count is close to its mean
        need = math.ceil(must + self._fresh_deficit(cls, free, left_ms, now_ms))
        dispersion = 1.0 if left_ms < self._service_now(cls) else self.evidence.dispersion(cls, after_ms)
        if adm.turnovers_at_least(need, rate * left_ms, dispersion) >= 1 - MISS_RISK:
            return None
        return Admission(False, "queue_full", adm.retry_after_ms(need, rate, self.engine._plans[cls].sla_ms))

    def _share_likely(self, plan: ClassPlan, count: int, tenant_rate: float, horizon_ms: float, now_ms: int) -> bool:
        """Whether the tenant's dispatches within ``horizon_ms`` reach ``count`` with a chance of at least
        ``1 - MISS_RISK``: a backlogged tenant gets what the slots leave after the other tenants' and
        the higher classes' requests, which come as they arrive (Poisson)."""
        if horizon_ms <= 0:
            return False
        name = plan.spec.name
        class_rate = plan.dispatch_rate.count(now_ms) / adm.WINDOW_MS
        others = max(0.0, class_rate - tenant_rate)
        for window, _higher in self.engine._higher_rates[name]:
            others += window.count(now_ms) / adm.WINDOW_MS
        mean = self.engine._cls_service.get(name)
        turnover = class_rate * (1.0 if mean is None else mean.dispersion())
        return adm.count_at_least(count, tenant_rate * horizon_ms, (others + turnover) * horizon_ms) >= 1 - SHARE_RISK

    def _tenant_drain(self, book: TenantInClass, now_ms: int) -> float | None:
        """``R_u``: the tenant's dispatches per ms in the class since its backlog there began, once
        that is a whole window ago; None without such history."""
        since = book.since_ms
        if since == UNKNOWN_MS:  # found waiting at start-up: its backlog counts from the first look
            since = book.since_ms = now_ms
        if since is None or since > now_ms - adm.WINDOW_MS:
            return None
        if book.idle_ms is not None and book.idle_ms <= now_ms - adm.WINDOW_MS:
            return None  # its queue has been empty for a window: its next request begins a new backlog
        return (book.dispatched - book.base) / (now_ms - since)

    def _earliest_promise_ms(self, cls: str, tenant: str, in_class: int) -> int | None:
        """``D``: the earliest deadline among the newest requests of other tenants whose bound is the
        whole class (``k / w >= in_class``) and that a new request of ``tenant`` would overtake (its
        fair-share tag below theirs); None when there is none."""
        earliest: int | None = None
        weights, unknown = self.engine._tenant_weight, self.engine._unknown_weight
        for lane in self.engine._class_lanes.get(cls, ()):
            new_tag = _new_tag(lane, tenant)
            for key, tq in lane.tenants.items():
                if (
                    not tq.live
                    or key == tenant
                    or self.engine._book(cls, key).waiting < in_class * weights.get(key, unknown)
                ):
                    continue
                tail = tq.tail()
                if tail is None or tail.deadline_ms is None or _tag(lane, tq, tail) <= new_tag:
                    continue  # it starts before the new request (ties go to the older)
                if earliest is None or tail.deadline_ms < earliest:
                    earliest = tail.deadline_ms
        return earliest

    def limit(self, plan: ClassPlan, now_ms: int) -> int:
        """The class depth the model admits for requests behind their whole class (``depth_limit``)."""
        usable = self._usable_slots(plan)
        drain = self._drain(plan, usable, now_ms)
        rate, after_ms = drain.rate_per_ms, self.evidence.after_ms(plan.spec.name, drain.measured, plan.sla_ms)
        free, horizon_ms = self._free_now(usable), self.evidence.kept_ms(plan.sla_ms, after_ms)
        fits = (
            rate * horizon_ms
            + free
            - self._higher_waiting(plan)
            - self._lower_at_preempt(plan.spec.name, now_ms + horizon_ms, rate * horizon_ms + free + 1)
            - self._fresh_deficit(plan.spec.name, free, horizon_ms, now_ms)
        )
        return max(0, min(int(fits), self.engine._depth_cap))

    # ------------------------------------------------------------------ early fast-fail
    def _hopeless(self, ticket: Ticket, plan: ClassPlan, higher: int, free: int, drain: Drain, now_ms: int) -> bool:
        deadline_ms = ticket.deadline_ms
        if deadline_ms is None:
            return False
        must = higher + self._ahead(ticket.cls, ticket.tenant, 0) - free
        if must <= 0:
            return False
        wait_ms = plan.first_wait_ms
        first_ms = deadline_ms if wait_ms is None else ticket.enqueued_ms + wait_ms
        before_ms = max(0, min(deadline_ms, first_ms) - now_ms)
        first_for_ms = max(0, deadline_ms - max(now_ms, first_ms))
        return drain.fail_rate_per_ms * before_ms + drain.preempt_rate_per_ms * first_for_ms < must

    def fast_fail(self, now_ms: int, failed: list[Ticket]) -> None:
        """End every hopeless tail (docs/engine.md, *early fast-fail*); appends them to ``failed``."""
        self.engine._fast_fail_due_ms = now_ms + FAST_FAIL_EVERY_MS
        for cls, grouped in groupby(self.engine._lane_list, key=lambda lane: lane.name):  # by level: higher first
            plan = self.engine._plans.get(cls)
            if plan is None or not plan.expires or not self.engine._depth_by_cls.get(cls):
                continue
            lanes = list(grouped)
            usable = self._usable_slots(plan)
            if usable <= 0:  # no capacity at all (backends out): no basis for a prediction
                continue
            drain = self._drain(plan, usable, now_ms, for_fail=True)
            if not drain.measured:  # an assumption may refuse a request, never fail an admitted one
                continue
            higher, free = self._higher_waiting(plan), self._free_now(usable)
            while True:  # the hopeless newest request that fair sharing would serve last goes first
                victim, last_tag = None, -math.inf
                for lane in lanes:
                    for tq in lane.tenants.values():
                        ticket = tq.tail() if tq.live else None
                        if ticket is None or not self._hopeless(ticket, plan, higher, free, drain, now_ms):
                            continue
                        ahead = tq.cost_sum - ticket.cost_tokens if lane.by_tokens else tq.live - 1
                        tag = tq.counter + ahead / tq.weight  # when fair sharing would start it
                        if tag > last_tag:
                            victim, last_tag = ticket, tag
                if victim is None:
                    break
                unqueue(self.engine, victim)
                assert victim.book is not None, "set on admission"
                for tally in victim.book.tallies:
                    tally.fast_failed += 1
                self.engine._terminate(victim, "queue_timeout")
                failed.append(victim)


def _due_by(lane: Lane, until_ms: float, cap: float) -> int:
    """The lane's waiting requests not yet at preempt whose age-heap key (when they reach it) is at
    most ``until_ms``, up to ``cap``: the heap's entries of at most that key form a subtree at its
    root. Entries of requests that left are stepped over; past ``STALE_VISITS`` of them the heap is
    compacted (the live entries keep their order, so no decision changes)."""
    age = lane.age
    count = stale = 0
    stack, size = [0], len(age)
    while stack and count < cap:
        i = stack.pop()
        key_ms, _, ticket = age[i]
        if key_ms > until_ms:
            continue
        if ticket.state == WAITING and ticket.lane is lane and not ticket.promoted:
            count += 1
        else:
            stale += 1
        child = 2 * i + 1
        if child < size:
            stack.append(child)
            if child + 1 < size:
                stack.append(child + 1)
    if stale > STALE_VISITS and stale > count:
        compact_age(lane)
    return count


def _tag(lane: Lane, tq: TenantQueue, ticket: Ticket) -> float:
    """When fair sharing would start ``ticket``, the newest of ``tq``: its tenant's counter once the
    requests ahead of it were charged."""
    ahead = tq.cost_sum - ticket.cost_tokens if lane.by_tokens else tq.live - 1
    return tq.counter + ahead / tq.weight


def _new_tag(lane: Lane, tenant: str) -> float:
    """The tag a new request of ``tenant`` would get in ``lane``, behind its tenant's queued ones; a
    tenant with none queued is lifted to the lane's least backlogged counter (``Lane.push``)."""
    tq = lane.tenants.get(tenant)
    if tq is not None and tq.live:
        return tq.counter + (tq.cost_sum if lane.by_tokens else tq.live) / tq.weight
    if tq is not None:
        counter = tq.counter
    else:
        stored = lane.store.fair_counter_get((lane.name, lane.model, tenant))
        counter = lane.vt if stored is None else stored
    floor = lane.min_backlogged()
    return max(counter, lane.vt if floor is None else floor)


def _queue_full(excess: float, rate_per_ms: float, plan: ClassPlan) -> Admission:
    """A ``queue_full`` refusal, retry-after the time to drain ``excess`` requests at ``rate_per_ms``."""
    return Admission(False, "queue_full", adm.retry_after_ms(math.ceil(excess), rate_per_ms, plan.sla_ms))
