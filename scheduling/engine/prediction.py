"""Prediction: admission by predicted dispatch, and early fast-fail of hopeless requests.

Both ask one model how many requests must start before a request can, and how fast its class
(or its tenant) starts them. Counts are requests, pooled across models as the depth limit's
capacity is (a class's lanes, one per model, are taken to drain in proportion to their depth).

    must = H + min(Q, k / w) - F        requests that must start before this one can
      H      requests waiting in higher classes (lower level): they go first
      Q      requests waiting in its class, itself included (taken to be the last)
      k / w  its tenant's waiting requests in the class, itself included, over the tenant's
             weight: fair sharing gives a backlogged tenant at least its weighted share w of
             the class's dispatches (not with FIFO lanes, where it is Q)
      F      slots free to the class now (a request among the first F starts at once)
    wait = must / R

``R``, the class's drain rate:

* **measured**, once the class has had requests waiting without a break for a whole window
  (60 s): every slot it could use was in use, so its dispatches are what the pool gives it, with
  what higher classes took and aging gave back. Two measurements: the last window's rate and the
  average since its backlog began; admission believes the lower, fast-fail the higher, and the
  assumption below if it is higher still (a minute of a 30-minute SLA is noisy, and the first one
  after a burst filled every slot at once under-counts: no slot frees until its first request
  ends; a dip must not fail requests, a peak must not admit them).
* **assumed** otherwise, in particular for a burst onto a quiet class (its measured rate would
  count its old arrivals): ``(S - O - L) / service_ms + sum(L_c / service_c)``. ``S``: slots
  usable by the class (less reserved slots unless it is the top class); ``O``: what higher
  classes are expected to hold, their dispatch rate over 60 s x their mean service time (their
  average occupancy, Little's law); ``L``: slots lower classes hold now, which come back once
  each at their own pace ``L_c / service_c``; ``service_ms``: the class's mean service time
  (``service_ms_prior`` until one has completed), the slower of its value now and at the
  backlog's first prediction (a burst's first completions are its shortest requests).

Why the assumption is conservative where the depth floor (``free slots x SLA / service``) was
not: the floor counts every slot higher classes do not hold *at this instant* as the class's for
its whole SLA, cycles slots that lower classes hold at the class's own pace, and admits until the
queue reaches the SLA exactly; here higher classes keep what they took over the last minute,
lower classes' slots return at theirs, waiting higher-class requests count as ahead, aging
(which only speeds a class's old requests) is ignored, a new request is put behind its whole
class, and the wait may use only ``predict_margin`` of the time to the deadline. What it cannot
know: a higher class rising above its last minute's rate, or a prior below the true service
time of a class that never completed anything (set ``service_ms_prior`` no lower than the
slowest class's service); the measured rate replaces the assumption after a minute.

**Fresh slots** (admission and the prediction of a wait). ``R`` counts a slot's turnovers at the
steady pace ``1 / service_ms``, which holds for a slot whose request is as likely to be anywhere
in its run (on average half done). A slot filled now is not: its first turnover is a whole
service time away, half a turnover less than ``R`` counts within any horizon ``T`` (``min(T /
service_ms, 1/2)`` less, for ``T`` shorter than it). So a request also needs ``G`` starts that
will not come: the ``F`` free slots the queue fills now, and the class's running slots younger
than half a service time on average (their mean age ``a``, from the sum of their start times,
O(1)): ``G = F x min(T / s, 1/2) + n x min(T / s, max(0, 1/2 - a / s))``. It matters when the
horizon is a few service times or less (a chat burst onto a pool a BATCH burst just filled).

**Chance** (admission on a short horizon). When the time to the deadline is shorter than the
class's mean service time, most slots turn over at most once before it and the count of
turnovers is a chance, not its mean: close to Poisson with mean ``R x left`` (many slots, each
ending at an unknown point of its run). Such a request is admitted only when ``P(N >= ceil(must
+ G)) >= 1 - MISS_RISK`` (5 %): otherwise a chat request admitted onto a pool held by long BATCH
requests waits for a turnover that, one time in four or five, does not come within its 3 s.

**Unknown class** and **margin after** (``queue.prior_weight``, ``queue.margin_after_ms``): see
``evidence``.

**Admission** (``queue.admission: predicted``, with ``enforce_depth``). A new request with
``left`` ms to its deadline (``min(enqueued + sla, the client's own)``) and margin ``m`` is
admitted when its class holds fewer than ``depth_cap`` and either a slot is free for it or:

1. its tenant's own drain, once the tenant has been backlogged in the class for a window
   (dispatches per ms since its backlog began, ``R_u``), starts it in time: ``k / R_u <= m x
   left`` (fair sharing, not the class's order, decides when a heavy tenant's requests start
   while others keep arriving); and
2. either its tenant's share starts it within the slack the margin keeps, ``H + k / w - F <=
   R x (1 - m) x left`` (so a small tenant is not locked out of a class another one filled, and
   all such requests together move others by at most that slack), or the class, itself included,
   drains in time for it and for every request it may overtake: ``H + Q - F <= R x m x
   (min(deadline, D) - now)``, ``D`` the earliest deadline among the newest requests of other
   tenants whose bound is the whole class (``k / w >= Q``; O(tenants), only for a request that
   fits its own deadline, so at most once per request admitted).

Otherwise ``queue_full`` (429), as the depth limit refuses: the request was never admitted and
the client should back off; the retry-after is the wait in excess of what fits, clamped to
``[1 ms, sla_ms]``. Counted as ``rejected_queue_full``.

**Early fast-fail** (``queue.fast_fail``, with ``enforce_deadline``). When ``expire`` runs, at
most every :data:`FAST_FAIL_EVERY_MS`, the newest request of every tenant's queue in every class
lane is checked, higher classes first, on a measured rate only (an assumption may refuse a
request, never fail an admitted one). It is hopeless when its class cannot start ``must``
requests before its deadline even with aging's help: ``R x (time until it outranks every other
class) + P x (time from then to its deadline) < must``, with ``R`` the highest of the measured
rates and the assumption, and
``P = max(R, S / service_ms)``, the class's mean service time now (from that wait ratio, boosted
past the top class or at preempt, its class takes every slot it may use as they free;
``ClassPlan.first_wait_ms``). A hopeless request ends ``queue_timeout`` at once (counted in
``queue_timeout`` and ``fast_failed``), the outcome it would have had at its deadline, returned
by ``expire`` like the expired ones (the gateway answers 504 ``queue_timeout`` for both). Among
the hopeless ones, the one fair sharing would start last goes first (the largest ``counter +
cost queued ahead of it / weight`` of its tenant; in a FIFO lane there is one), then the check
is repeated, until none is hopeless: a flooding tenant's newest requests go, a small tenant's
stay. O(tenants x lanes) per check and
again per request failed. Not checked when the class has no usable slot (backends out: no basis).

The two agree: a request admitted at ``now`` is not hopeless at ``now`` (``m <= 1``, and the
fast-fail rates are at least the admission one), so only a later change (the drain rate fell, a
higher class surged, another tenant's share came in ahead) fails it early. Neither is evaluated
with ``single_queue``. The engine tracks backlog starts (per class and per tenant in a class, in
O(1) as requests queue and leave) only while one of them is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import groupby
from typing import NamedTuple

from . import admission as adm
from .capacity import Capacity
from .class_plans import ClassPlan
from .counters import Counters, TenantInClass
from .evidence import EvidenceMixin
from .fairness import Lane
from .model import SchedulerConfig
from .outcomes import Admission
from .store import Ticket

FAST_FAIL_EVERY_MS = 250  # the fast-fail check runs at most this often (when expire runs)
MISS_RISK = 0.05  # the chance of missing its deadline that admission accepts for a request on a short horizon
UNKNOWN_MS = math.inf  # backlog start of a class whose requests were found in the store at start-up


class Drain(NamedTuple):
    """What the model knows of one class's draining at one instant."""

    rate_per_ms: float  # R for admission: the lower measured rate, or the assumption
    fail_rate_per_ms: float  # R for fast-fail: the highest measured rate, or the assumption if higher
    preempt_rate_per_ms: float  # P: the class's rate once its requests outrank every other class
    measured: bool  # the rates are measured (else assumed)


class PredictMixin(EvidenceMixin):
    """Needs the attributes that :class:`Scheduler` sets up (plans, counts, rates, capacity, ...)."""

    # Set up and kept by Scheduler (declared here for the type checker; no values at class level).
    _plans: dict[str, ClassPlan]
    _capacity: Capacity
    _depth_by_cls: dict[str, int]
    _running_by_cls: dict[str, int]
    _started_sum: dict[str, int]
    _higher: dict[str, tuple[str, ...]]
    _higher_rates: dict[str, tuple[tuple[adm.RateWindow, str], ...]]
    _cls_service: dict[str, adm.ServiceMean]
    _config: SchedulerConfig
    _lower: dict[str, tuple[str, ...]]
    _backlog_since: dict[str, float]
    _backlog_base: dict[str, int]
    _backlog_service: dict[str, tuple[float, float]]
    counters: Counters
    _fair_lanes: bool
    _predict_margin: float
    _depth_cap: int
    _lane_list: list[Lane]
    _class_lanes: dict[str, list[Lane]]
    _tenant_weight: dict[str, float]
    _unknown_weight: float
    _fast_fail_due_ms: float
    _book: Callable[[str, str], TenantInClass]
    _unqueue: Callable[[Ticket], None]
    _terminate: Callable[[Ticket, str], None]

    # ------------------------------------------------------------------ the model
    def _higher_waiting(self, plan: ClassPlan) -> int:
        depth, waiting = self._depth_by_cls, 0
        for name in self._higher[plan.spec.name]:
            waiting += depth.get(name, 0)
        return waiting

    def _service_now(self, name: str) -> float:
        """``service_ms(name)``, read directly (the hot path of predicted admission)."""
        mean, prior = self._cls_service.get(name), self._config.queue.service_ms_prior
        return mean.value(prior) if mean is not None else float(prior)

    def _usable_slots(self, plan: ClassPlan) -> int:
        capacity = self._capacity
        return capacity.total_slots - (0 if plan.privileged else capacity.total_reserved)

    def _free_now(self, usable: int) -> int:
        return max(0, usable - sum(self._running_by_cls.values()))

    def _ahead(self, cls: str, tenant: str, extra: int) -> float:
        """``min(Q, k / w)`` with ``extra`` (1 for a new request) added to both counts."""
        in_class = self._depth_by_cls.get(cls, 0) + extra
        if not self._fair_lanes:
            return in_class
        own = self._book(cls, tenant).waiting + extra
        return min(in_class, own / self._tenant_weight.get(tenant, self._unknown_weight))

    def _drain(self, plan: ClassPlan, usable: int, now_ms: int, *, for_fail: bool = False) -> Drain:
        """The class's rates (``for_fail``: the fast-fail rate also counts the assumption)."""
        name = plan.spec.name
        since = self._backlog_since.get(name)
        if since == UNKNOWN_MS:  # found waiting at start-up: its backlog counts from the first look
            since = self._backlog_since[name] = now_ms
        # the mean service time: for admission's assumption, the slower of its value now and at the
        # backlog's first prediction (a burst's first completions are its shortest); else its value now
        live_ms = slow_ms = self._service_now(name)
        if since is not None:
            start = self._backlog_service.get(name)
            if start is None or start[0] != since:  # this backlog's first look (inf: no completion yet)
                unknown = bool(self._prior_weight) and name not in self._cls_service
                start = self._backlog_service[name] = (since, math.inf if unknown else live_ms)
            slow_ms = max(live_ms, start[1])
        elif self._prior_weight and name not in self._cls_service:  # never served, and nothing waits
            slow_ms = math.inf
        if slow_ms == math.inf:
            slow_ms = self._unknown_service_ms(name, now_ms)
        if since is not None and since <= now_ms - adm.WINDOW_MS:
            recent = plan.dispatch_rate.count(now_ms) / adm.WINDOW_MS
            dispatched = self.counters.for_class(name).dispatched - self._backlog_base[name]
            backlog = dispatched / (now_ms - since)
            high = max(recent, backlog, self._assumed_rate(name, usable, live_ms, now_ms) if for_fail else 0.0)
            return Drain(min(recent, backlog), high, max(high, usable / live_ms), True)
        rate = self._assumed_rate(name, usable, slow_ms, now_ms)
        return Drain(rate, rate, max(rate, usable / live_ms), False)

    def _assumed_rate(self, name: str, usable: int, service_ms: float, now_ms: int) -> float:
        """``(S - O - L) / service_ms + sum(L_c / service_c)`` (the module docstring)."""
        services, prior = self._cls_service, self._config.queue.service_ms_prior
        busy_ms = 0.0  # slot-ms higher classes took over 60 s: / 60 s, the slots they hold (Little's law)
        for window, higher in self._higher_rates[name]:
            dispatched = window.count(now_ms)
            if dispatched:
                mean = services.get(higher)
                busy_ms += dispatched * (mean.value(prior) if mean is not None else prior)
        held = busy_ms / adm.WINDOW_MS
        freed = 0.0  # slots lower classes hold now come back at their own pace, each once
        running = self._running_by_cls
        for lower in self._lower[name]:
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
        plan = self._plans[cls]
        usable = self._usable_slots(plan)
        free = self._free_now(usable)
        must = self._higher_waiting(plan) + self._ahead(cls, tenant, 1) - free
        if must <= 0:
            return 0.0
        rate = self._drain(plan, usable, now_ms).rate_per_ms
        wait_ms = (must + self._fresh_deficit(cls, free, must / rate, now_ms)) / rate if rate > 0 else math.inf
        book = self._book(cls, tenant)
        tenant_rate = self._tenant_drain(book, now_ms)
        if tenant_rate is not None:
            wait_ms = max(wait_ms, (book.waiting + 1) / tenant_rate if tenant_rate > 0 else math.inf)
        return wait_ms

    # ------------------------------------------------------------------ admission
    def _fresh_deficit(self, cls: str, free: int, horizon_ms: float, now_ms: int) -> float:
        """``G``: the starts a rate ``R`` over-counts within ``horizon_ms`` because the slots the
        class fills are fresh (module docstring, *fresh slots*)."""
        service_ms = self._service_now(cls)
        if horizon_ms <= 0 or service_ms <= 0:
            return 0.0
        cap = min(0.5, horizon_ms / service_ms)
        deficit = max(0, free) * cap
        running = self._running_by_cls.get(cls, 0)
        if running > 0:
            age_ms = now_ms - self._started_sum.get(cls, 0) / running
            deficit += running * min(cap, max(0.0, 0.5 - age_ms / service_ms))
        return deficit

    def _predicted_refusal(
        self, plan: ClassPlan, book: TenantInClass, tenant: str, deadline_ms: int, now_ms: int
    ) -> Admission | None:
        """None when the model admits a new request of ``tenant`` (its ``book`` in the class; rules in
        the module docstring)."""
        cls = plan.spec.name
        depth = self._depth_by_cls.get(cls, 0)
        capacity = self._capacity
        usable = capacity.total_slots - (0 if plan.privileged else capacity.total_reserved)
        free = max(0, usable - sum(self._running_by_cls.values()))
        base = self._higher_waiting(plan) - free  # H - F
        if depth < self._depth_cap and base + depth + 1 <= 0:
            return None  # a slot is free for it
        drain = self._drain(plan, usable, now_ms)
        rate = drain.rate_per_ms
        if depth >= self._depth_cap:
            return _queue_full(depth - self._depth_cap + 1, rate, plan)
        left_ms = max(0, deadline_ms - now_ms)
        after_ms = self._after_ms(cls, drain.measured, left_ms)
        kept_ms = self._kept_ms(left_ms, after_ms)  # what a predicted wait may take of it
        tenant_rate = None if book.since_ms is None else self._tenant_drain(book, now_ms)
        if tenant_rate is not None and book.waiting + 1 > tenant_rate * kept_ms:
            return _queue_full(book.waiting + 1 - tenant_rate * kept_ms, tenant_rate, plan)
        share = (book.waiting + 1) / self._tenant_weight.get(tenant, self._unknown_weight) if self._fair_lanes else 0.0
        if self._fair_lanes:
            slack_ms = left_ms - kept_ms
            if base + share + self._fresh_deficit(cls, free, slack_ms, now_ms) <= rate * slack_ms:
                return self._unlikely(
                    cls, base + share, free, rate, left_ms, now_ms, after_ms
                )  # its share of the slack
        horizon_ms = kept_ms
        excess = base + depth + 1 + self._fresh_deficit(cls, free, horizon_ms, now_ms) - rate * horizon_ms
        if excess <= 0 and self._fair_lanes:  # it fits its own deadline: does it fit those it may overtake?
            promised_ms = self._earliest_promise_ms(cls, tenant, depth + 1)
            if promised_ms is not None and promised_ms < deadline_ms:
                horizon_ms = self._kept_ms(max(0, promised_ms - now_ms), after_ms)
                excess = base + depth + 1 + self._fresh_deficit(cls, free, horizon_ms, now_ms) - rate * horizon_ms
        if excess > 0:
            return _queue_full(excess, rate, plan)
        must = base + (min(depth + 1, share) if self._fair_lanes else depth + 1)
        return self._unlikely(cls, must, free, rate, left_ms, now_ms, after_ms)

    def _unlikely(
        self, cls: str, must: float, free: int, rate: float, left_ms: int, now_ms: int, after_ms: int = 0
    ) -> Admission | None:
        """A ``queue_full`` when the wait fits on average but a slot-turnover count as likely as not
        reaching ``must`` by the deadline is too likely (module docstring, *chance*); else None."""
        if (left_ms >= self._service_now(cls) and left_ms > after_ms) or must <= 0:
            return None  # the slots turn over more than once: the count is close to its mean
        need = math.ceil(must + self._fresh_deficit(cls, free, left_ms, now_ms))
        dispersion = 1.0 if left_ms < self._service_now(cls) else self._dispersion(cls, after_ms)
        if adm.turnovers_at_least(need, rate * left_ms, dispersion) >= 1 - MISS_RISK:
            return None
        return Admission(False, "queue_full", adm.retry_after_ms(need, rate, self._plans[cls].sla_ms))

    def _tenant_drain(self, book: TenantInClass, now_ms: int) -> float | None:
        """``R_u``: the tenant's dispatches per ms in the class since its backlog there began, once
        that is a whole window ago; None without such history."""
        since = book.since_ms
        if since == UNKNOWN_MS:  # found waiting at start-up: its backlog counts from the first look
            since = book.since_ms = now_ms
        if since is None or since > now_ms - adm.WINDOW_MS:
            return None
        return (book.dispatched - book.base) / (now_ms - since)

    def _earliest_promise_ms(self, cls: str, tenant: str, in_class: int) -> int | None:
        """``D``: the earliest deadline among the newest requests of other tenants whose bound is the
        whole class (``k / w >= in_class``); None when there is none."""
        earliest: int | None = None
        weights, unknown = self._tenant_weight, self._unknown_weight
        for lane in self._class_lanes.get(cls, ()):
            for key, tq in lane.tenants.items():
                if not tq.live or key == tenant or self._book(cls, key).waiting < in_class * weights.get(key, unknown):
                    continue
                tail = tq.tail()
                deadline_ms = None if tail is None else tail.deadline_ms
                if deadline_ms is not None and (earliest is None or deadline_ms < earliest):
                    earliest = deadline_ms
        return earliest

    def _predicted_limit(self, plan: ClassPlan, now_ms: int) -> int:
        """The class depth the model admits for requests behind their whole class (``depth_limit``)."""
        usable = self._usable_slots(plan)
        drain = self._drain(plan, usable, now_ms)
        rate, after_ms = drain.rate_per_ms, self._after_ms(plan.spec.name, drain.measured, plan.sla_ms)
        free, horizon_ms = self._free_now(usable), self._kept_ms(plan.sla_ms, after_ms)
        fits = (
            rate * horizon_ms
            + free
            - self._higher_waiting(plan)
            - self._fresh_deficit(plan.spec.name, free, horizon_ms, now_ms)
        )
        return max(0, min(int(fits), self._depth_cap))

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

    def _fast_fail(self, now_ms: int, failed: list[Ticket]) -> None:
        """End every hopeless tail (see the module docstring); appends them to ``failed``."""
        self._fast_fail_due_ms = now_ms + FAST_FAIL_EVERY_MS
        for cls, grouped in groupby(self._lane_list, key=lambda lane: lane.name):  # by level: higher first
            plan = self._plans.get(cls)
            if plan is None or not plan.expires or not self._depth_by_cls.get(cls):
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
                self._unqueue(victim)
                assert victim.book is not None, "set on admission"
                for tally in victim.book.tallies:
                    tally.fast_failed += 1
                self._terminate(victim, "queue_timeout")
                failed.append(victim)


def _queue_full(excess: float, rate_per_ms: float, plan: ClassPlan) -> Admission:
    """A ``queue_full`` refusal, retry-after the time to drain ``excess`` requests at ``rate_per_ms``."""
    return Admission(False, "queue_full", adm.retry_after_ms(math.ceil(excess), rate_per_ms, plan.sla_ms))
