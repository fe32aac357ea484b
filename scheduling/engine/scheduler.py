"""The engine's facade: admission, queues, dispatch, terminal states, positions.

:class:`Scheduler` keeps the queues (lanes, age and deadline heaps), the counts and the rates, and
composes the parts that decide on them: the admission rule (``admission_rules``), the dispatch
order (``dispatching``), the prediction model (``prediction``, with ``evidence``) and the headroom
(``headroom``). Every admitted request ends in exactly one terminal state. Nothing here reads the
clock (callers pass a non-decreasing ``now_ms``) and the same inputs give the same decisions.
How it decides, and how a reconfiguration treats waiting requests: docs/engine.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heappop

from . import admission as adm
from . import eta
from .admission_rules import AdmissionRule, DepthAdmission, PredictedAdmission
from .aging import AgingCurve
from .capacity import Capacity
from .class_plans import ClassPlan
from .counters import Counters, TenantInClass
from .dispatching import DispatchOrder, PreemptEntry, RescueEntry
from .fairness import Lane, tenant_weights
from .forecast import DemandProfile
from .headroom import Headroom
from .headroom_spare import LowerSpare
from .model import BackendSpec, ClassSpec, Request, RequestId, SchedulerConfig, TenantSpec
from .outcomes import ADMITTED, NO_BACKEND, Admission, Grant, Live, QueuePosition
from .prediction import UNKNOWN_MS, Prediction
from .queues import apply_config, count_queued, enqueue, rebuild, unqueue
from .store import DONE, RUNNING, STATE_NAMES, WAITING, MemoryStore, SchedulerStore, Ticket


def _live(ticket: Ticket) -> Live:
    return Live(ticket.request, STATE_NAMES[ticket.state], ticket.backend, ticket.dispatched_ms)


class Scheduler:
    # Set by ``queues.apply_config`` from the configuration (declared here for the type checker).
    _config: SchedulerConfig
    _classes: dict[str, ClassSpec]
    _top_level: int
    _aging: AgingCurve
    _aging_on: bool
    _single_queue: bool
    _lanes_age: bool
    _enforce_depth: bool
    _plans: dict[str, ClassPlan]
    _higher: dict[str, tuple[str, ...]]
    _higher_rates: dict[str, tuple[tuple[adm.RateWindow, str], ...]]
    _lower: dict[str, tuple[str, ...]]
    _predicted: bool
    _fast_fail_on: bool
    _tracks_backlogs: bool
    _fair_lanes: bool
    _predict_margin: float
    _prior_weight: int
    _margin_after_ms: int
    _depth_cap: int
    _rescue_ms: int
    _tenant_weight: dict[str, float]
    _unknown_weight: float

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
        # slots held for the top class, no more than the lower classes can spare (``headroom``)
        self.headroom = Headroom(self._capacity, LowerSpare(self))
        self.eta_book = eta.EtaBook()  # the ETA's calibration (``eta``)
        self.demand: DemandProfile | None = None  # arrivals by (class, tenant) and time of day (predicted admission)
        self._tenant_specs: dict[str, TenantSpec] = {t.slug: t for t in tenants}
        self._retired: dict[str, ClassSpec] = {}
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._lane_list: list[Lane] = []
        self._class_lanes: dict[str, list[Lane]] = {}  # the lanes of each class (one per model)
        self._preempt: dict[str, list[PreemptEntry]] = {}
        self._deadlines: list[tuple[int, str, Ticket]] = []
        self._rescue: dict[tuple[str, str], list[RescueEntry]] = {}  # by lane key: waiting requests by deadline
        self.rescued = 0  # grants the deadline rescue took out of the fair order
        self._promote_due_ms: float = 0  # no waiting request reaches preempt before this (``DispatchOrder.promote``)
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
        self.order = DispatchOrder(self)  # the dispatch order (``dispatching``)
        self.prediction = Prediction(self)  # predicted admission's model and fast-fail (``prediction``)
        self._depth_admission = DepthAdmission(self)
        self._predicted_admission = PredictedAdmission(self, self.prediction)
        self.admission: AdmissionRule = self._depth_admission  # picked from the configuration
        apply_config(self, config)
        rebuild(self)

    # ----------------------------------------------------------------- configuration
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
            apply_config(self, config)
        elif tenants is not None:
            self._weights()
        if backends is not None:
            self._capacity.reconfigure(backends)
        rebuild(self)

    def _book(self, cls: str, tenant: str) -> TenantInClass:
        key = (cls, tenant)
        book = self._books.get(key)
        if book is None:
            book = self._books[key] = TenantInClass(*self.counters.pair(cls, tenant))
        return book

    # ----------------------------------------------------------------- admission
    def submit(self, request: Request, *, now_ms: int) -> Admission:
        if request.cls not in self._classes:
            raise ValueError(f"unknown class {request.cls!r}")
        if self._store.ticket_get(request.id) is not None:
            raise ValueError(f"request {request.id!r} is already in the scheduler")
        if self.headroom.forecast is not None and self._plans[request.cls].privileged:
            self.headroom.top_arrival(now_ms)
        if self.demand is not None:
            self.demand.observe(request.cls, request.tenant, now_ms)
        tenant = self._tenant_specs.get(request.tenant)
        vip = request.vip or (tenant is not None and tenant.vip)
        book = self._book(request.cls, request.tenant)
        cls_tally, tenant_tally = book.tallies
        if not self._capacity.serves(request.model, vip):
            cls_tally.rejected_no_backend += 1
            tenant_tally.rejected_no_backend += 1
            return NO_BACKEND
        if self._enforce_depth:
            refusal = self.admission.refusal(request, book, now_ms)
            if refusal is not None:
                cls_tally.rejected_queue_full += 1
                tenant_tally.rejected_queue_full += 1
                return refusal
        ticket = Ticket(request, self._next_seq, vip)
        ticket.book = book
        self._next_seq += 1
        self._clock_ms = now_ms
        enqueue(self, ticket, front=False)
        count_queued(self, ticket, +1)
        self._store.ticket_put(ticket)
        cls_tally.enqueued += 1
        tenant_tally.enqueued += 1
        return ADMITTED

    def depth(self, cls: str) -> int:
        return self._depth_by_cls.get(cls, 0)

    def depth_limit(self, cls: str, *, now_ms: int) -> int:
        """The class's depth limit by the admission rule (computed even when the policy does not enforce
        it): the depth rule's, or with predicted admission the depth the prediction admits."""
        return self.admission.depth_limit(cls, now_ms)

    def service_ms(self, cls: str) -> float:
        """The class's mean service time (dispatch to completion): measured, else the configured prior."""
        return self._service(self._cls_service, cls)

    def _service(self, table: dict[str, adm.ServiceMean], key: str) -> float:
        mean = table.get(key)
        return mean.value(self._config.queue.service_ms_prior) if mean else float(self._config.queue.service_ms_prior)

    # ----------------------------------------------------------------- dispatch
    def dispatch(self, *, now_ms: int) -> list[Grant]:
        """Grant every free slot it can, in the dispatch order (``dispatching``)."""
        return self.order.dispatch(now_ms=now_ms)

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
        enqueue(self, ticket, front=True)
        count_queued(self, ticket, +1)
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
        unqueue(self, ticket)
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
            unqueue(self, ticket)
            self._terminate(ticket, "queue_timeout")
            expired.append(ticket.request)
        if self._fast_fail_on and self._waiting and now_ms >= self._fast_fail_due_ms:
            failed: list[Ticket] = []
            self.prediction.fast_fail(now_ms, failed)
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
    def predicted_wait_ms(self, cls: str, tenant: str, *, now_ms: int) -> float:
        """The prediction model's wait for a new request of ``tenant`` in ``cls`` (``prediction``)."""
        return self.prediction.predicted_wait_ms(cls, tenant, now_ms=now_ms)

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
        """A waiting request's position and ETA (``eta``); the first one given is kept on its ticket."""
        ticket = self._store.ticket_get(request_id)
        if ticket is None or ticket.state != WAITING:
            return None
        return eta.position(self, ticket, now_ms)

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
                if self.order.oldest(lane) is not None:
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
