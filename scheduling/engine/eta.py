"""A waiting request's position and ETA as a promise: point, upper bound, confidence, slip reason.

Computed on query only (``Scheduler.position``). Kept per ticket: the first ETA given
(``Ticket.eta_first``), set by the first query; kept per class: :class:`EtaBook`, the ratios of
actual wait to the model's wait of the requests that were asked about, which calibrate the point
(their most common ratio) and the upper bound (a high quantile). The model, its calibration and the
meaning of each field: docs/engine.md, "Position and ETA".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import admission as adm
from .outcomes import QueuePosition
from .position import eta_ms, requests_ahead
from .store import EtaFirst, Ticket

if TYPE_CHECKING:
    from .scheduler import Scheduler

MEASURED, PRIOR, BLOCKED = "measured", "prior", "blocked"
HIGHER_CLASS, FAIR_SHARE, CIRCUIT_OPEN = "higher_class", "fair_share", "circuit_open"
SLIP_GRACE_MS = 1_000  # an expected start later than the first one given by more than this has slipped
MIN_SHARE = 0.1  # the least share of the model's turnover left to a class below busy higher classes
BLOCKED_SHARE = 0.5  # higher classes' dispatches at or above this share of the turnover: blocked
STEPS_PER_DOUBLING = 8  # EtaBook's resolution: ratio buckets 2 ** (1/8) wide
LOWEST_STEP, STEPS = -32, 80  # buckets cover ratios 1/16 to 16 (beyond: the end buckets)
BOOK_MIN = 20  # ratios of a key before its book calibrates the ETA
BOOK_HALVES_AT = 2_000  # a key's counts are halved when they reach this (the recent ones weigh)
UPPER_QUANTILE = 0.92  # the upper bound: this quantile of the ratios (at most twice the point)
COVER = 0.8  # the point is raised until twice it covers at least this share of the ratios
SUBSTEPS = 4  # candidate points per bucket
CLOSE_LOW, CLOSE_HIGH = 1 / 1.3, 1 / 0.7  # a wait within 30 % of the point: ratio / point in this range
_CLOSE_STEPS = (  # those limits in buckets
    STEPS_PER_DOUBLING * math.log2(CLOSE_LOW),
    STEPS_PER_DOUBLING * math.log2(CLOSE_HIGH),
)


class EtaBook:
    """Per class and depth (``near``: within the model's slots of the head, else ``far``), a
    histogram of actual wait / the model's wait of the requests that got a first ETA."""

    __slots__ = ("counts", "_factors")

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self._factors: dict[str, tuple[float, float] | None] = {}  # by key, until its counts change

    def as_record(self) -> dict[str, list[int]]:
        return {key: list(counts) for key, counts in self.counts.items()}

    @classmethod
    def from_record(cls, record: dict[str, list[int]] | None) -> EtaBook:
        """The book a record holds; a key kept at another resolution (an older engine's) starts anew."""
        book = cls()
        book.counts = {key: list(counts) for key, counts in (record or {}).items() if len(counts) == STEPS}
        return book

    def started(self, ticket: Ticket, now_ms: int) -> None:
        """``ticket`` (with a first ETA) was dispatched at ``now_ms``."""
        first = ticket.eta_first
        assert first is not None
        model_ms = first[4]
        if model_ms <= 0:
            return
        ratio = max(now_ms - first[3], 1) / model_ms
        step = min(STEPS - 1, max(0, math.floor(STEPS_PER_DOUBLING * math.log2(ratio)) - LOWEST_STEP))
        counts = self.counts.get(first[5])
        if counts is None:
            counts = self.counts[first[5]] = [0] * STEPS
        counts[step] += 1
        self._factors.pop(first[5], None)
        if sum(counts) >= BOOK_HALVES_AT:
            counts[:] = [c // 2 for c in counts]

    def factors(self, key: str) -> tuple[float, float] | None:
        """(point, upper) multipliers of the model's wait for ``key``; None until it has `BOOK_MIN` ratios.

        The point: the ratio with the most ratios within 30 % of it (the middle of the first run of
        such points), among those whose double covers `COVER` of them; the upper bound: the
        `UPPER_QUANTILE` ratio, between the point and twice it."""
        if key in self._factors:
            return self._factors[key]
        factors = self._factors[key] = self._fresh_factors(key)
        return factors

    def _fresh_factors(self, key: str) -> tuple[float, float] | None:
        counts = self.counts.get(key)
        total = sum(counts) if counts else 0
        if not counts or total < BOOK_MIN:
            return None
        cumulative = [0]
        for count in counts:
            cumulative.append(cumulative[-1] + count)
        first = last = STEPS * SUBSTEPS  # the run of candidates with the most ratios close, in ticks
        best_close = -1.0
        for tick in range(STEPS * SUBSTEPS + 1):  # candidate points, a quarter of a bucket apart
            at = tick / SUBSTEPS
            if _below(cumulative, at + STEPS_PER_DOUBLING) < COVER * total:
                continue  # twice this point would cover less than COVER
            close = _below(cumulative, at + _CLOSE_STEPS[1]) - _below(cumulative, at + _CLOSE_STEPS[0])
            if close > best_close + 1e-9:
                first = last = tick
                best_close = close
            elif close > best_close - 1e-9 and last == tick - 1:
                last = tick
        best = (first + last) / (2 * SUBSTEPS)
        point = _ratio(best)
        return point, min(2 * point, max(point, _ratio(_edge(counts, total, UPPER_QUANTILE))))


def _ratio(edge: float) -> float:
    """The ratio at a bucket edge (edge 0: the lowest bucket's lower edge)."""
    return float(2.0 ** ((edge + LOWEST_STEP) / STEPS_PER_DOUBLING))


def _edge(counts: list[int], total: int, share: float) -> int:
    """The upper edge of the bucket that holds ``share`` of the histogram."""
    seen = 0
    for step, count in enumerate(counts):
        seen += count
        if seen >= share * total:
            return step + 1
    return STEPS


def _below(cumulative: list[int], edge: float) -> float:
    """The ratios below fractional bucket edge ``edge`` (spread evenly within a bucket)."""
    if edge <= 0:
        return 0.0
    if edge >= STEPS:
        return float(cumulative[-1])
    whole = int(edge)
    return cumulative[whole] + (edge - whole) * (cumulative[whole + 1] - cumulative[whole])


def position(sched: Scheduler, ticket: Ticket, now_ms: int) -> QueuePosition:
    """The position and ETA of waiting ``ticket``; records its first ETA if it had none."""
    if sched._aging.preempt_ratio is not None:
        sched.order.promote(now_ms)  # neutral: dispatch would promote the same requests at now_ms
    model = ticket.model
    lanes = [lane for lane in sched._lane_list if lane.model == model]
    ranks = {lane.key: sched.order.rank(lane, now_ms) for lane in lanes}
    boosted = sched._aging_on and any(r[0] != r[1] for r in ranks.values() if len(r) > 1)
    ahead, exact = requests_ahead(ticket, lanes, lambda ln: ranks[ln.key], sched._preempt.get(model, []), boosted)
    capacity = sched._capacity
    slots = capacity.model_slots(model)
    model_mean_ms = sched._service(sched._model_service, model)  # a class's mean may mix faster models
    own_ms = max(sched._service(sched._cls_service, ticket.cls), model_mean_ms)
    own_rank = ranks[ticket.lane.key] if ticket.lane is not None else None
    work_ms = 0.0  # service time of the requests ahead of it (those of other lanes at their class's mean)
    counted = 0
    for lane in lanes:
        if lane is not ticket.lane and lane.live and own_rank is not None and ranks[lane.key] < own_rank:
            count = lane.live - lane.promoted
            work_ms += count * max(sched._service(sched._cls_service, lane.name), model_mean_ms)
            counted += count
    work_ms += (ahead - counted) * own_ms
    mean_ms = work_ms / ahead if ahead > 0 else own_ms
    higher = sched._higher.get(ticket.cls, ())
    busy = 0.0  # the share of the slots higher classes' new requests keep busy (their recent dispatches)
    if slots:
        for name in higher:
            rate = adm.rate_window(sched._cls_rate, name).count(now_ms) / adm.WINDOW_MS
            busy += rate * sched._service(sched._cls_service, name) / slots
    share = max(MIN_SHARE, 1.0 - busy)
    turnover = slots / mean_ms * share  # starts per ms left to it
    free = capacity.free_slots(model, now_ms)
    plan = sched._plans[ticket.cls]
    if not (plan.privileged or ticket.vip):  # reserved and held slots are not its
        free -= capacity.model_reserved(model) + len(sched.headroom.holds)
    model_ms = eta_ms(ahead, free, turnover)
    point = upper = model_ms
    key = f"{ticket.cls}/{'near' if ahead < slots else 'far'}"
    if model_ms > 0:
        factors = sched.eta_book.factors(key)
        if factors is not None:  # calibrated by the actual waits of earlier requests like it
            point = math.ceil(model_ms * factors[0])
            upper = math.ceil(model_ms * factors[1])
        else:  # its spread not measured yet: the widest bound the promise allows
            upper = 2 * point
        upper = min(2 * point, max(point, upper))
    higher_waiting = sum(ln.live for ln in lanes if ln.level < plan.level)
    cls_service = sched._cls_service.get(ticket.cls)
    if slots and (higher_waiting >= slots or busy >= BLOCKED_SHARE):
        confidence = BLOCKED
    elif cls_service is None or not cls_service.samples:
        confidence = PRIOR
    else:
        confidence = MEASURED
    seen = sum(sched.counters.classes[name].enqueued for name in higher if name in sched.counters.classes)
    first = ticket.eta_first
    reason = None
    if first is None:
        if point >= 0:
            ticket.eta_first = (now_ms + point, seen, slots, now_ms, model_ms, key)
    elif point < 0 or now_ms + point > first[0] + SLIP_GRACE_MS:
        reason = _slip_reason(sched, ticket, first, seen, slots)
    first_at = None if ticket.eta_first is None else ticket.eta_first[0]
    return QueuePosition(ahead + 1, point, exact, upper, confidence, reason, first_at)


def _slip_reason(sched: Scheduler, ticket: Ticket, first: EtaFirst, seen: int, slots: int) -> str | None:
    """Why the expected start moved past the first one given: a backend of its model left the
    rotation (circuit open), a higher class's traffic came since, or other tenants' fair share in
    its lane; None when none of those holds (its model served slower than measured)."""
    if slots < first[2]:
        return CIRCUIT_OPEN
    if seen > first[1]:
        return HIGHER_CLASS
    lane, tq = ticket.lane, ticket.tq
    if lane is not None and tq is not None and not lane.fifo:
        if any(other is not tq and other.live > other.promoted for other in lane.tenants.values()):
            return FAIR_SHARE
    return None


def carry_promises(old: Scheduler | None, new: Scheduler) -> None:
    """What ``old`` promised (first ETAs of the tickets ``new`` still holds, its calibration) into
    ``new``: a replica rebuilt from the owner's snapshot, which has none of them (nobody asks the owner)."""
    if old is None:
        return
    new.eta_book = old.eta_book
    for ticket in new._store.tickets():
        before = old._store.ticket_get(ticket.id)
        if before is not None and before.eta_first is not None and ticket.eta_first is None:
            ticket.eta_first = before.eta_first
