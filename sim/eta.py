"""ETA calibration: the ETA the engine gives each request at admission, against when it started.

:class:`EtaTraced` is the simulation that asks the engine for every admitted request's position
right after its admission (which also fixes the request's first ETA) and notes when it actually
started; :func:`calibration` sums that up per class. The measures and the targets:
docs/simulator.md, "ETA calibration".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sim.generators import TraceRequest
from sim.simulation import Simulation

IN_BOUND_TARGET = 0.90  # share of `measured` requests that start by their upper bound
ERROR_TARGET = 0.30  # median |start - point| / actual wait of `measured` requests that waited


@dataclass(slots=True)
class Promise:
    at_ms: int  # admitted
    eta_ms: int
    upper_ms: int
    confidence: str
    started_ms: int | None = None


class EtaTraced(Simulation):
    """The simulation, with every admitted request's ETA at admission and its actual start."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.promises: dict[str, tuple[str, Promise]] = {}

    def on_arrival(self, r: TraceRequest, t_ms: int) -> None:
        super().on_arrival(r, t_ms)
        flight = self.flights.get(r.id)
        if flight is None:  # refused
            return
        position = self.sched.position(r.id, now_ms=t_ms)
        if position is None or position.eta_ms < 0:
            return
        promise = Promise(t_ms, position.eta_ms, position.eta_upper_ms, position.eta_confidence)
        self.promises[r.id] = (flight.cls, promise)

    def _start(self, grant, t_ms: int) -> None:
        super()._start(grant, t_ms)
        noted = self.promises.get(grant.request.id)
        if noted is not None:
            noted[1].started_ms = t_ms


def relative_error(p: Promise) -> float:
    """|start - point| / actual wait (a request that started at once: 0 if promised 0, else its
    point over one ms)."""
    assert p.started_ms is not None
    waited = p.started_ms - p.at_ms
    return abs(waited - p.eta_ms) / max(waited, 1)


def instant(p: Promise) -> bool:
    """Promised 0 and started at once: its relative error is 0/0, not a measurement."""
    return p.eta_ms == 0 and p.started_ms == p.at_ms


def calibration(promises: list[Promise]) -> dict:
    """Of the requests that started: how many, the share not `measured`, and for the `measured`
    ones the share started by the upper bound and the median relative error of those that waited
    (``median_error``; ``median_error_all`` counts the instant starts too)."""
    started = [p for p in promises if p.started_ms is not None]
    measured = [p for p in started if p.confidence == "measured"]
    waited = [p for p in measured if not instant(p)]
    in_bound = sum(1 for p in measured if p.started_ms - p.at_ms <= p.upper_ms)  # type: ignore[operator]
    return {
        "started": len(started),
        "measured": len(measured),
        "not_measured_share": 1 - len(measured) / len(started) if started else 0.0,
        "blocked": sum(1 for p in started if p.confidence == "blocked"),
        "prior": sum(1 for p in started if p.confidence == "prior"),
        "in_bound": in_bound / len(measured) if measured else None,
        "median_error": statistics.median(relative_error(p) for p in waited) if waited else None,
        "median_error_all": statistics.median(relative_error(p) for p in measured) if measured else None,
        "zero_wait": sum(1 for p in measured if p.started_ms == p.at_ms),
    }


def by_class(sim: EtaTraced) -> dict[str, dict]:
    groups: dict[str, list[Promise]] = {cls: [] for cls in sim.classes}
    for cls, promise in sim.promises.values():
        groups[cls].append(promise)
    return {cls: calibration(group) for cls, group in groups.items()}
