"""The scheduler facade: admission, queues, dispatch, terminal states, positions.

See ``dispatching`` for the decision order (preempt EDF, then class by ``level - boost`` of
its oldest request, then the fair-share pick) and its consequences. Every admitted request
ends in exactly one terminal state: completed, failed, queue_timeout or cancelled; rejected
requests (queue_full, no_backend) were never admitted. Nothing here reads the clock; callers
pass a non-decreasing ``now_ms``. The same inputs give the same decisions (dicts in insertion
order, heaps keyed on total orders, no randomness).

Configuration changes (:meth:`reconfigure`) rebuild the in-memory indexes from the store's
tickets in queue order: waiting requests keep their place, take the new SLA (ratio and
expiry deadline) and the new weights for future picks, and fair counters are kept. A class
removed from the configuration keeps its old spec (level, SLA) for requests it already
holds, which are served and expired as before; it takes no new requests. A removed backend
finishes its running requests; waiting requests of a model left without backends stay queued
until they expire. The per-class values every decision reads (:class:`ClassPlan`: preempt
wait, deadline rule, privilege) are recomputed whenever the configuration is applied.

Admission is by the dynamic depth limit (``admission``) or, with ``queue.admission: predicted``,
by predicted dispatch time; ``queue.fast_fail`` ends a waiting request as ``queue_timeout`` as
soon as its predicted dispatch is past its deadline (``prediction``). With ``headroom.enabled`` a
freed slot may stay free briefly for the top class's forecast arrivals (``headroom``).
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heapify, heappop, heappush

from . import admission as adm
from .aging import AgingCurve
from .capacity import Capacity
from .class_plans import ClassPlan
from .counters import Counters, TenantInClass
from .dispatching import DispatchMixin, PreemptEntry, RescueEntry
from .fairness import Lane, tenant_weights
from .headroom import Headroom
from .model import BackendSpec, ClassSpec, FairnessMode, Request, RequestId, SchedulerConfig, TenantSpec
from .outcomes import ADMITTED, NO_BACKEND, Admission, Live, QueuePosition
from .position import eta_ms, requests_ahead
from .prediction import UNKNOWN_MS, PredictMixin
from .store import DONE, RUNNING, STATE_NAMES, WAITING, MemoryStore, SchedulerStore, Ticket

DEADLINE_SLACK = 1024  # stale deadline entries tolerated beyond twice the waiting ones before a compaction
AGE_SLACK = 1024  # stale age-heap entries tolerated beyond twice a lane's waiting requests before a compaction


def _live(ticket: Ticket) -> Live:
    return Live(ticket.request, STATE_NAMES[ticket.state], ticket.backend, ticket.dispatched_ms)


class Scheduler(DispatchMixin, PredictMixin):
    def __init__(
        self,
        config: SchedulerConfig,
        *,
        tenants: Iterable[TenantSpec],
        backends: Iterable[BackendSpec],
        store: SchedulerStore | None = None,
    ) -> None:
        self._store: SchedulerStore = store if store is not None else MemoryStore()
        self.counters = Counters()
        self._books: dict[tuple[str, str], TenantInClass] = {}  # by (class, tenant)
        self._store_holds_live_tickets = getattr(self._store, "holds_live_tickets", False)
        self._capacity = Capacity(backends, self._store)
        self.headroom = Headroom(self._capacity)  # slots held for the top class (``headroom``)
        self._tenant_specs: dict[str, TenantSpec] = {t.slug: t for t in tenants}
        self._retired: dict[str, ClassSpec] = {}
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._lane_list: list[Lane] = []
        self._class_lanes: dict[str, list[Lane]] = {}  # the lanes of each class (one per model)
        self._preempt: dict[str, list[PreemptEntry]] = {}
        self._deadlines: list[tuple[int, str, Ticket]] = []
        self._rescue: dict[tuple[str, str], list[RescueEntry]] = {}  # by lane key: waiting requests by deadline
        self.rescued = 0  # grants the deadline rescue took out of the fair order
        self._promote_due_ms: float = 0  # no waiting request reaches preempt before this (see _promote)
        self._waiting = 0
        self._promoted = 0
        self._depth_by_cls: dict[str, int] = {}
        self._running_by_cls: dict[str, int] = {}
        self._started_sum: dict[str, int] = {}  # by class: the sum of its running requests' dispatched_ms
        self._backlog_since: dict[str, float] = {}  # by class: when its queue last became non-empty
        self._backlog_base: dict[str, int] = {}  # by class: its dispatch count at that moment
        self._backlog_service: dict[str, tuple[float, float]] = {}  # by class: (that moment, mean service then)
        self._backlog_done: dict[str, tuple[float, int, int]] = {}  # by class: (that moment, completions, their ms)
        self._clock_ms: float = UNKNOWN_MS  # the now of the call that is queueing (submit, requeue, reconfigure)
        self._fast_fail_due_ms: float = 0
        self._cls_rate: dict[str, adm.RateWindow] = {}
        self._model_rate: dict[str, adm.RateWindow] = {}
        self._cls_service: dict[str, adm.ServiceMean] = {}
        self._model_service: dict[str, adm.ServiceMean] = {}
        self._next_seq = 1
        self._next_front = 0
        self._apply_config(config)
        self._rebuild()

    # ----------------------------------------------------------------- configuration
    def _apply_config(self, config: SchedulerConfig) -> None:
        old = getattr(self, "_config", None)
        self._config = config
        self._classes = {c.name: c for c in config.classes}
        if old is not None:
            held = {t.cls for t in self._store.tickets()}
            for spec in (*old.classes, *self._retired.values()):
                if spec.name not in self._classes and spec.name in held:
                    self._retired[spec.name] = spec
        self._retired = {k: v for k, v in self._retired.items() if k not in self._classes}
        self._top_level = min((c.level for c in config.classes), default=0)
        self._aging = AgingCurve(config.aging)
        self._aging_on = self._aging.active
        self._single_queue = config.queue.single_queue
        self._lanes_age = self._aging_on and not self._single_queue  # a lane's rank rises with its oldest wait
        queue = config.queue
        self._enforce_depth = queue.enforce_depth
        self._plans = {name: self._make_plan(spec) for name, spec in (*self._classes.items(), *self._retired.items())}
        self._higher = {
            name: tuple(other for other, p in self._plans.items() if p.level < plan.level)
            for name, plan in self._plans.items()
        }
        self._higher_rates = {  # (their dispatch-rate window, name), read on every predicted admission
            name: tuple((adm.rate_window(self._cls_rate, other), other) for other in higher)
            for name, higher in self._higher.items()
        }
        self._lower = {
            name: tuple(other for other, p in self._plans.items() if p.level > plan.level)
            for name, plan in self._plans.items()
        }
        self._predicted = queue.enforce_depth and queue.admission == "predicted" and not self._single_queue
        self._fast_fail_on = queue.fast_fail and queue.enforce_deadline and not self._single_queue
        self._tracks_backlogs = self._predicted or self._fast_fail_on  # backlog starts: only prediction reads them
        self._fair_lanes = config.fairness.mode != FairnessMode.FIFO and not self._single_queue
        self._predict_margin = queue.predict_margin
        self._prior_weight = queue.prior_weight if self._predicted else 0
        self._margin_after_ms = queue.margin_after_ms if self._predicted else 0
        self._depth_cap = queue.depth_cap
        self.headroom.apply(config.headroom, single_queue=self._single_queue)
        # the deadline rescue needs deadlines (expiry) and a fair order to step out of
        self._rescue_ms = config.headroom.rescue_ms if queue.enforce_deadline and not self._single_queue else 0
        self._weights()

    def _make_plan(self, spec: ClassSpec) -> ClassPlan:
        return ClassPlan(
            spec,
            self._aging,
            expires=self._config.queue.enforce_deadline,
            top_level=self._top_level,
            dispatch_rate=adm.rate_window(self._cls_rate, spec.name),
        )

    def _weights(self) -> None:
        fairness = self._config.fairness
        self._tenant_weight, self._unknown_weight = tenant_weights(self._tenant_specs.values(), fairness.min_share)

    def _class_spec(self, cls: str) -> ClassSpec:
        spec = self._classes.get(cls)
        return spec if spec is not None else self._retired[cls]

    def reconfigure(
        self,
        *,
        now_ms: int,
        config: SchedulerConfig | None = None,
        tenants: Iterable[TenantSpec] | None = None,
        backends: Iterable[BackendSpec] | None = None,
    ) -> None:
        """Apply new settings to the running engine; no waiting request is lost."""
        if tenants is None and config is not None and config.tenants is not None:
            tenants = config.tenants
        if backends is None and config is not None and config.backends is not None:
            backends = config.backends
        self._clock_ms = now_ms
        if tenants is not None:
            self._tenant_specs = {t.slug: t for t in tenants}
        if config is not None:
            self._apply_config(config)
        elif tenants is not None:
            self._weights()
        if backends is not None:
            self._capacity.reconfigure(backends)
        self._rebuild()

    def _rebuild(self) -> None:
        """Recreate lanes and heaps from the store's waiting tickets, in queue order."""
        old_vt = {key: lane.vt for key, lane in self._lanes.items()}
        old_since, old_base = self._backlog_since, self._backlog_base
        self._lanes, self._lane_list, self._preempt, self._deadlines = {}, [], {}, []
        self._rescue = {}
        self._class_lanes = {}
        self._promote_due_ms = float("inf")
        self._promoted = self._waiting = 0
        self._depth_by_cls, self._running_by_cls, self._started_sum = {}, {}, {}
        self._backlog_since, self._backlog_base = {}, {}
        old_book_since = {key: (book.since_ms, book.base) for key, book in self._books.items()}
        for book in self._books.values():
            book.waiting, book.since_ms = 0, None
        tickets = sorted(self._store.tickets(), key=lambda t: t.qseq)
        for ticket in tickets:
            ticket.book = self._book(ticket.cls, ticket.tenant)
            if ticket.state == RUNNING:
                self._running_by_cls[ticket.cls] = self._running_by_cls.get(ticket.cls, 0) + 1
                self._started_sum[ticket.cls] = self._started_sum.get(ticket.cls, 0) + (ticket.dispatched_ms or 0)
            elif ticket.state == WAITING:
                ticket.promoted = False
                self._enqueue(ticket, front=False, lift=False)
                self._count_queued(ticket, +1)
        for key, lane in self._lanes.items():
            lane.vt = old_vt.get(key, 0.0)
        for key, book in self._books.items():  # a tenant still backlogged keeps its start
            if book.waiting and old_book_since[key][0] is not None:
                book.since_ms, book.base = old_book_since[key]
        for cls in self._backlog_since:  # a class still backlogged keeps its start
            if cls in old_since:
                self._backlog_since[cls], self._backlog_base[cls] = old_since[cls], old_base[cls]
        since = self._backlog_since
        self._backlog_service = {c: v for c, v in self._backlog_service.items() if since.get(c) == v[0]}

    def _lane_for(self, cls: str, model: str) -> Lane:
        key = ("*", model) if self._single_queue else (cls, model)
        lane = self._lanes.get(key)
        if lane is None:
            level = 0 if self._single_queue else self._class_spec(cls).level
            mode = FairnessMode.FIFO if self._single_queue else self._config.fairness.mode
            lane = Lane(key[0], model, level, mode, self._tenant_weight, self._unknown_weight, self._store)
            lane.sla_ms = 0 if self._single_queue else self._class_spec(cls).sla_ms
            self._lanes[key] = lane
            adm.rate_window(self._model_rate, model)  # dispatch counts into it without a lookup miss
            self._lane_list.append(lane)
            self._lane_list.sort(key=lambda ln: (ln.level, ln.name, ln.model))
            self._class_lanes.setdefault(lane.name, []).append(lane)
        return lane

    def _enqueue(self, ticket: Ticket, front: bool, lift: bool = True) -> None:
        plan = self._plans[ticket.cls]
        lane = self._lane_for(ticket.cls, ticket.model)
        lane.push(ticket, front, lift)
        enqueued = ticket.enqueued_ms
        # age heap key: when it reaches preempt, or (never preempting) when it was enqueued
        age_key_ms = enqueued if plan.preempt_wait_ms is None else enqueued + plan.preempt_wait_ms
        heappush(lane.age, (age_key_ms, ticket.id, ticket))
        if age_key_ms < self._promote_due_ms:
            self._promote_due_ms = age_key_ms
        if plan.expires:
            ticket.deadline_ms = plan.deadline_ms(enqueued, ticket.request.deadline_ms)
            heappush(self._deadlines, (ticket.deadline_ms, ticket.id, ticket))
            if self._rescue_ms:
                self._rescue_push(lane, ticket, ticket.deadline_ms)
        else:
            ticket.deadline_ms = None

    # ----------------------------------------------------------------- admission
    def submit(self, request: Request, *, now_ms: int) -> Admission:
        if request.cls not in self._classes:
            raise ValueError(f"unknown class {request.cls!r}")
        if self._store.ticket_get(request.id) is not None:
            raise ValueError(f"request {request.id!r} is already in the scheduler")
        if self.headroom.forecast is not None and self._plans[request.cls].privileged:
            self.headroom.top_arrival(now_ms)
        tenant = self._tenant_specs.get(request.tenant)
        vip = request.vip or (tenant is not None and tenant.vip)
        book = self._book(request.cls, request.tenant)
        cls_tally, tenant_tally = book.tallies
        if not self._capacity.serves(request.model, vip):
            cls_tally.rejected_no_backend += 1
            tenant_tally.rejected_no_backend += 1
            return NO_BACKEND
        if self._enforce_depth:
            if self._predicted:
                plan = self._plans[request.cls]
                deadline_ms = plan.deadline_ms(request.enqueued_ms, request.deadline_ms)
                refusal = self._predicted_refusal(plan, book, request.tenant, deadline_ms, now_ms)
            else:
                refusal = self._refusal(request, book.waiting, now_ms)
            if refusal is not None:
                cls_tally.rejected_queue_full += 1
                tenant_tally.rejected_queue_full += 1
                return refusal
        ticket = Ticket(request, self._next_seq, vip)
        ticket.book = book
        self._next_seq += 1
        self._clock_ms = now_ms
        self._enqueue(ticket, front=False)
        self._count_queued(ticket, +1)
        self._store.ticket_put(ticket)
        cls_tally.enqueued += 1
        tenant_tally.enqueued += 1
        return ADMITTED

    def _refusal(self, request: Request, own: int, now_ms: int) -> Admission | None:
        """Refuse with ``queue_full`` unless depth admits it (``own``: the tenant's depth in the class)."""
        spec = self._classes[request.cls]
        limit = self.depth_limit(request.cls, now_ms=now_ms)
        depth = self._depth_by_cls.get(request.cls, 0)
        room = adm.tenant_room(self._tenant_weight.get(request.tenant, self._unknown_weight), limit)
        if adm.admits(depth, own, limit, room):
            return None
        drain_per_ms = adm.rate_window(self._cls_rate, request.cls).count(now_ms) / adm.WINDOW_MS
        if drain_per_ms <= 0:
            drain_per_ms = self._free_slots_for(spec) / self._service(self._cls_service, request.cls)
        retry = adm.retry_after_ms(depth - limit + 1, drain_per_ms, spec.sla_ms)
        return Admission(False, "queue_full", retry)

    def depth(self, cls: str) -> int:
        return self._depth_by_cls.get(cls, 0)

    def depth_limit(self, cls: str, *, now_ms: int) -> int:
        """The class's dynamic depth limit (computed even when the policy does not enforce it); with
        predicted admission, the depth the prediction admits (``prediction``)."""
        if self._predicted:
            return self._predicted_limit(self._plans[cls], now_ms)
        spec = self._class_spec(cls)
        mean_ms = self._service(self._cls_service, cls)
        floor = adm.floor_depth(self._free_slots_for(spec), spec.sla_ms, mean_ms)
        dispatched = adm.rate_window(self._cls_rate, cls).count(now_ms)
        return adm.depth_limit(dispatched, spec.sla_ms, floor, self._config.queue.depth_cap)

    def _free_slots_for(self, spec: ClassSpec) -> int:
        capacity = self._capacity
        slots = capacity.total_slots - (0 if spec.level <= self._top_level else capacity.total_reserved)
        for cls, running in self._running_by_cls.items():
            if running and self._class_spec(cls).level < spec.level:
                slots -= running
        return max(slots, 0)

    def service_ms(self, cls: str) -> float:
        """The class's mean service time (dispatch to completion): measured, else the configured prior."""
        return self._service(self._cls_service, cls)

    def _service(self, table: dict[str, adm.ServiceMean], key: str) -> float:
        mean = table.get(key)
        return mean.value(self._config.queue.service_ms_prior) if mean else float(self._config.queue.service_ms_prior)

    def _count_queued(self, ticket: Ticket, delta: int) -> None:
        book = ticket.book
        assert book is not None, "set on admission"
        self._waiting += delta
        waiting = book.waiting = book.waiting + delta
        cls = ticket.cls
        depth = self._depth_by_cls[cls] = self._depth_by_cls.get(cls, 0) + delta
        if self._tracks_backlogs:  # when a tenant's and a class's queue last became non-empty (prediction)
            if waiting == 0:
                book.since_ms = None
            elif waiting == delta:
                book.since_ms, book.base = self._clock_ms, book.dispatched
            if depth == 0:
                self._backlog_since.pop(cls, None)
                self._backlog_service.pop(cls, None)
            elif depth == delta:
                self._backlog_since[cls], self._backlog_base[cls] = self._clock_ms, book.tallies[0].dispatched

    def _unqueue(self, ticket: Ticket) -> None:
        """Take a waiting ticket out of every index (lazily where heaps hold it)."""
        if ticket.promoted:
            self._promoted -= 1
        lane = ticket.lane
        assert lane is not None, "a waiting ticket is in a lane"
        lane.detach(ticket)
        ticket.promoted = False
        self._count_queued(ticket, -1)
        if len(self._deadlines) > 2 * self._waiting + DEADLINE_SLACK:
            self._compact_deadlines()
        if len(lane.age) > 2 * lane.live + AGE_SLACK:
            self._compact_age(lane)
        if self._rescue_ms:
            self._rescue_compact(lane)

    def _compact_deadlines(self) -> None:
        """Drop the deadline heap's entries of tickets no longer waiting (left lazily when they were
        dispatched or cancelled; with long SLAs they never reach the top). In place: `expire` may be
        popping this very list. The live entries keep their total order, so nothing else changes."""
        heap = self._deadlines
        heap[:] = [entry for entry in heap if entry[2].state == WAITING and entry[2].deadline_ms == entry[0]]
        heapify(heap)

    @staticmethod
    def _compact_age(lane: Lane) -> None:
        """Drop the lane's age-heap entries of requests that left it (left lazily: only the top is
        checked, so while one request waits long, the entries of every request dispatched after it
        stayed, as many as the lane dispatched meanwhile, each holding its finished ticket — in the
        shared dispatcher's snapshot too). In place, like the deadlines. The entries left are those
        the lazy checks would accept, one per request (a request put back by a 429 may have two,
        alike): their order is total, so the top, and every decision, stay the same."""
        seen: set[str] = set()
        live: list[tuple[int, str, Ticket]] = []
        for entry in lane.age:
            ticket = entry[2]
            if ticket.state == WAITING and ticket.lane is lane and not ticket.promoted and entry[1] not in seen:
                seen.add(entry[1])
                live.append(entry)
        lane.age[:] = live
        heapify(lane.age)

    # ----------------------------------------------------------------- terminal states
    def _running_ticket(self, request_id: RequestId) -> Ticket:
        ticket = self._store.ticket_get(request_id)
        if ticket is None or ticket.state != RUNNING:
            raise KeyError(f"request {request_id!r} is not running")
        return ticket

    def _finish_running(self, ticket: Ticket, token_delta: int, fair_delta: float, now_ms: int) -> None:
        assert ticket.backend is not None, "set on dispatch"
        self._capacity.release(ticket.backend, ticket.window_handle, token_delta)
        self._running_by_cls[ticket.cls] -= 1
        self._started_sum[ticket.cls] -= ticket.dispatched_ms or 0
        self.headroom.slot_freed(now_ms, self._lower_waiting)
        if fair_delta and ticket.charge_lane is not None:
            lane = self._lanes.get(ticket.charge_lane)
            if lane is not None and not lane.fifo:
                lane.adjust(lane.queue_for(ticket.tenant), fair_delta)
            elif lane is None:  # lane gone since (reconfigured): correct the stored counter
                key = (*ticket.charge_lane, ticket.tenant)
                self._store.fair_counter_set(key, (self._store.fair_counter_get(key) or 0.0) + fair_delta)

    @staticmethod
    def _token_correction(ticket: Ticket, actual_cost: int) -> float:
        if not ticket.charge_by_tokens or not ticket.cost_tokens:
            return 0.0
        return ticket.charge * (actual_cost - ticket.cost_tokens) / ticket.cost_tokens

    def complete(self, request_id: RequestId, *, now_ms: int, prompt_tokens: int, output_tokens: int) -> None:
        ticket = self._running_ticket(request_id)
        actual_cost = prompt_tokens + 2 * output_tokens
        self._finish_running(
            ticket,
            prompt_tokens + output_tokens - ticket.est_tokens,
            self._token_correction(ticket, actual_cost),
            now_ms,
        )
        assert ticket.dispatched_ms is not None, "set on dispatch"
        service_ms = now_ms - ticket.dispatched_ms
        adm.service_mean(self._cls_service, ticket.cls).add(service_ms)
        adm.service_mean(self._model_service, ticket.model).add(service_ms)
        if self._prior_weight:  # the backlog's completions, for the censored mean (prediction)
            self._count_done(ticket.cls, service_ms)
        self._terminate(ticket, "completed")

    def _count_done(self, cls: str, service_ms: int) -> None:
        since = self._backlog_since.get(cls)
        if since is None:
            return
        done = self._backlog_done.get(cls)
        count, total_ms = (done[1], done[2]) if done is not None and done[0] == since else (0, 0)
        self._backlog_done[cls] = (since, count + 1, total_ms + service_ms)

    def fail(self, request_id: RequestId, *, now_ms: int, reason: str = "upstream_error") -> None:
        ticket = self._running_ticket(request_id)
        self._finish_running(ticket, 0, self._token_correction(ticket, 0), now_ms)
        self._terminate(ticket, "failed")

    def requeue(self, request_id: RequestId, *, now_ms: int, backend_retry_after_ms: int = 0) -> None:
        """Upstream 429: back to the front of its queue; the backend is held until the retry-after."""
        ticket = self._running_ticket(request_id)
        backend = ticket.backend
        assert backend is not None, "set on dispatch"
        self._finish_running(ticket, -ticket.est_tokens, -ticket.charge, now_ms)
        if backend_retry_after_ms > 0:
            self._capacity.hold(backend, now_ms + backend_retry_after_ms)
        ticket.state = WAITING
        ticket.backend = ticket.dispatched_ms = ticket.window_handle = ticket.charge_lane = None
        ticket.charge = 0.0
        ticket.charge_by_tokens = False
        self._next_front -= 1
        ticket.qseq = self._next_front
        self._clock_ms = now_ms
        self._enqueue(ticket, front=True)
        self._count_queued(ticket, +1)
        if not self._store_holds_live_tickets:
            self._store.ticket_put(ticket)
        assert ticket.book is not None, "set on admission"
        for tally in ticket.book.tallies:
            tally.requeued += 1

    def cancel(self, request_id: RequestId, *, now_ms: int) -> bool:
        """Client gone. A waiting request leaves at once (unless the policy ignores cancellation)."""
        ticket = self._store.ticket_get(request_id)
        if ticket is None or ticket.state != WAITING or not self._config.queue.honour_cancel:
            return False
        self._unqueue(ticket)
        self._terminate(ticket, "cancelled")
        return True

    def expire(self, *, now_ms: int) -> list[Request]:
        """Remove waiting requests past their deadline (terminal ``queue_timeout``) and, with
        ``fast_fail``, those whose predicted dispatch is past it (checked at most every
        ``prediction.FAST_FAIL_EVERY_MS``)."""
        expired: list[Request] = []
        heap = self._deadlines
        while heap and heap[0][0] < now_ms:
            deadline_ms, _, ticket = heappop(heap)
            if ticket.state != WAITING or ticket.deadline_ms != deadline_ms:
                continue
            self._unqueue(ticket)
            self._terminate(ticket, "queue_timeout")
            expired.append(ticket.request)
        if self._fast_fail_on and self._waiting and now_ms >= self._fast_fail_due_ms:
            failed: list[Ticket] = []
            self._fast_fail(now_ms, failed)
            expired.extend(ticket.request for ticket in failed)
        return expired

    def _terminate(self, ticket: Ticket, outcome: str) -> None:
        ticket.state = DONE
        self._store.ticket_pop(ticket.id)
        assert ticket.book is not None, "set on admission"
        for tally in ticket.book.tallies:
            setattr(tally, outcome, getattr(tally, outcome) + 1)
        if (
            ticket.cls in self._retired
            and not self._depth_by_cls.get(ticket.cls)
            and not self._running_by_cls.get(ticket.cls)
        ):
            del self._retired[ticket.cls]

    # ----------------------------------------------------------------- queries
    def headroom_need(self, *, now_ms: int) -> int:
        """Slots the forecast wants free for the top class at ``now_ms`` (0: headroom off or no need)."""
        return self.headroom.need(now_ms)

    def headroom_holds(self) -> tuple[int, ...]:
        """The ends of the current holds (ms, ascending)."""
        return tuple(self.headroom.holds)

    def free_rate(self, now_ms: int) -> float:
        """Slots freed per ms recently (headroom's turnover)."""
        return self.headroom.free_rate(now_ms)

    @property
    def held_slot_ms(self) -> int:
        """Slot-ms left idle by headroom's holds so far (what it cost the lower classes)."""
        return self.headroom.held_slot_ms

    def _lower_waiting(self) -> bool:
        """Whether a request of a class below the top waits (else a free slot stays free anyway)."""
        plans = self._plans
        return any(depth and not plans[cls].privileged for cls, depth in self._depth_by_cls.items())

    def state_of(self, request_id: RequestId) -> str | None:
        ticket = self._store.ticket_get(request_id)
        return None if ticket is None else STATE_NAMES.get(ticket.state)

    def requests_of(self, tenant: str) -> list[Live]:
        """The live requests of ``tenant`` (queued or running), in no particular order; reads every
        live ticket (the console's and the queue API's reads, not the request path)."""
        return [_live(t) for t in self._store.tickets() if t.tenant == tenant and t.state in STATE_NAMES]

    def live(self, request_id: RequestId) -> Live | None:
        """One live request (queued or running); None if it is not."""
        ticket = self._store.ticket_get(request_id)
        return None if ticket is None or ticket.state not in STATE_NAMES else _live(ticket)

    def backend_of(self, request_id: RequestId) -> str | None:
        """The backend a running request was granted (None: not running)."""
        ticket = self._store.ticket_get(request_id)
        return None if ticket is None else ticket.backend

    def position(self, request_id: RequestId, *, now_ms: int) -> QueuePosition | None:
        ticket = self._store.ticket_get(request_id)
        if ticket is None or ticket.state != WAITING:
            return None
        if self._aging.preempt_ratio is not None:
            self._promote(now_ms)  # neutral: dispatch would promote the same requests at now_ms
        lanes = [lane for lane in self._lane_list if lane.model == ticket.model]
        ranks = {lane.key: self._rank(lane, now_ms) for lane in lanes}
        boosted = self._aging_on and any(r[0] != r[1] for r in ranks.values() if len(r) > 1)
        ahead, exact = requests_ahead(
            ticket, lanes, lambda ln: ranks[ln.key], self._preempt.get(ticket.model, []), boosted
        )
        capacity = self._capacity
        slots = capacity.model_slots(ticket.model)
        rate = adm.rate_window(self._model_rate, ticket.model).count(now_ms) / adm.WINDOW_MS
        rate = max(rate, slots / self._service(self._model_service, ticket.model))
        return QueuePosition(ahead + 1, eta_ms(ahead, capacity.free_slots(ticket.model, now_ms), rate), exact)

    def next_wakeup_ms(self, *, now_ms: int) -> int | None:
        """Earliest future ms at which dispatch/expire could act without outside input."""
        if not self._waiting:
            return None
        times: list[int] = []
        heap = self._deadlines
        while heap and (heap[0][2].state != WAITING or heap[0][2].deadline_ms != heap[0][0]):
            heappop(heap)
        if heap:
            times.append(heap[0][0] + 1)
        if self._aging.preempt_ratio is not None:
            for lane in self._lane_list:
                if self._oldest(lane) is not None:
                    times.append(lane.age[0][0])
        reopen = self._capacity.next_reopen_ms(now_ms)
        if reopen is not None:
            times.append(reopen)
        holds = self.headroom.holds
        if holds:  # a held slot goes to a lower class at its hold's end
            times.append(holds[0])
        future = [t for t in times if t > now_ms]
        return min(future) if future else None

    def waiting(self, tenant: str | None = None) -> list[Request]:
        tickets = (t for t in self._store.tickets() if t.state == WAITING and (tenant is None or t.tenant == tenant))
        return [t.request for t in sorted(tickets, key=lambda t: t.qseq)]

    def running(self, tenant: str | None = None) -> list[Request]:
        tickets = (t for t in self._store.tickets() if t.state == RUNNING and (tenant is None or t.tenant == tenant))
        return [t.request for t in sorted(tickets, key=lambda t: (t.dispatched_ms, t.id))]

    @property
    def waiting_count(self) -> int:
        return self._waiting
