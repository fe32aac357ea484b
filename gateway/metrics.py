"""Prometheus metrics of the gateway, in registries of their own (served at /metrics).

Event counts measured at the gateway are counters and histograms in `REGISTRY`; state read at
scrape time (the scheduler's depths, limits, aging and backend slots, the batch tallies) comes from
collectors in `LIVE`. Under ``serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR`` set: prometheus
client's multiprocess mode) every process writes its `REGISTRY` values to files there and a scrape
sums them over all processes, those that exited included; the two gauges are ``livesum`` (what live
processes hold now). `LIVE` is read in the process scraped: the shared scheduler's replica is the
same in each.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
REGISTRY = CollectorRegistry(auto_describe=False)
LIVE = CollectorRegistry(auto_describe=True)  # collectors read at scrape time
WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600)
FIRST_TOKEN_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)

REJECTS = Counter("fairgate_rejects", "Requests answered with an error, by code.", ["code"], registry=REGISTRY)
DOWNGRADES = Counter("fairgate_downgrades", "Class downgrades, by rule.", ["rule"], registry=REGISTRY)
UPSTREAM_ERRORS = Counter(
    "fairgate_upstream_errors", "Upstream failures, by backend and kind.", ["backend", "kind"], registry=REGISTRY
)
WAIT = Histogram(
    "fairgate_queue_wait_seconds",
    "Time from admission to dispatch, by class and tenant.",
    ["cls", "tenant"],
    buckets=WAIT_BUCKETS_S,
    registry=REGISTRY,
)
BILLING_WAIT_SECONDS = Histogram(
    "fairgate_billing_wait_seconds",
    "How long an answer waited for billing, counted only when it did wait: step=hold, an early hold's"
    " booking before the answer's first byte; step=settlement, the settlement's journal line written (or synced)"
    " before the answer's end.",
    ["step"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
    registry=REGISTRY,
)
INTAKE_WAITING = Gauge(
    "fairgate_intake_waiting",
    "Requests waiting for a turn at intake (gateway.lanes), by declared class.",
    ["cls"],
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
COMPLETED = Counter("fairgate_requests_completed", "Requests served, by class.", ["cls"], registry=REGISTRY)
# By tenant and class (gateway.access: both from configuration, never from what a client sent).
REQUESTS = Counter(
    "fairgate_requests",
    "API requests ended, by tenant, class and outcome (an Outcome or the ErrorCode answered).",
    ["tenant", "cls", "outcome"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "fairgate_tokens",
    "Tokens charged, by tenant, class and kind (prompt, completion).",
    ["tenant", "cls", "kind"],
    registry=REGISTRY,
)
SPEND = Counter(
    "fairgate_spend",
    "Charges settled, by tenant and class, in the billing currency.",
    ["tenant", "cls"],
    registry=REGISTRY,
)
FIRST_TOKEN = Histogram(
    "fairgate_time_to_first_token_seconds",
    "Time from a request's arrival to the first bytes of its answer (a whole answer: all of it), by tenant and class.",
    ["tenant", "cls"],
    buckets=FIRST_TOKEN_BUCKETS_S,
    registry=REGISTRY,
)


class SchedulerCollector:
    """Reads ``snapshot()`` of the running dispatcher; nothing when none is running."""

    def __init__(self, snapshot: Callable[[], dict | None]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return _scheduler_families({"classes": {}, "backends": {}})

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        if snap is not None:
            yield from _scheduler_families(snap)


def _scheduler_families(snap: dict) -> Iterator[Metric]:
    gauges = {
        "depth": GaugeMetricFamily("fairgate_queue_depth", "Waiting requests per class.", labels=["cls"]),
        "depth_limit": GaugeMetricFamily("fairgate_queue_depth_limit", "Depth limit per class.", labels=["cls"]),
    }
    boosts = CounterMetricFamily("fairgate_aging_boosts", "Dispatches won by aging, per class.", labels=["cls"])
    preempts = CounterMetricFamily("fairgate_aging_preempts", "Dispatches at preempt, per class.", labels=["cls"])
    for cls, row in snap["classes"].items():
        gauges["depth"].add_metric([cls], row["depth"])
        gauges["depth_limit"].add_metric([cls], row["depth_limit"])
        boosts.add_metric([cls], row["boosted"])
        preempts.add_metric([cls], row["preempted"])
    in_use = GaugeMetricFamily("fairgate_backend_slots_in_use", "Requests running per backend.", labels=["backend"])
    slots = GaugeMetricFamily("fairgate_backend_slots", "Configured slots per backend.", labels=["backend"])
    tpm = GaugeMetricFamily("fairgate_backend_tpm_used", "Tokens completed in the last 60 s.", labels=["backend"])
    circuit = GaugeMetricFamily("fairgate_backend_circuit_open", "1 while the circuit is open.", labels=["backend"])
    for name, row in snap["backends"].items():
        in_use.add_metric([name], row["in_use"])
        slots.add_metric([name], row["slots"])
        tpm.add_metric([name], row["tpm_used"])
        circuit.add_metric([name], 1 if row["circuit_open"] else 0)
    yield from (*gauges.values(), boosts, preempts, in_use, slots, tpm, circuit)


def install_collector(snapshot: Callable[[], dict | None]) -> None:
    LIVE.register(SchedulerCollector(snapshot))


def multiprocess_dir() -> Path | None:
    """The directory of multiprocess mode (set by ``serve --workers N``), else None."""
    path = os.environ.get(MULTIPROC_ENV)
    return Path(path) if path else None


def multiprocess_prepare(var_dir: Path, *, port: int) -> Path:
    """For ``serve --workers N``, before the workers start: an emptied directory for every process's
    values (``PROMETHEUS_MULTIPROC_DIR`` if set, else one per port under the var directory), set in
    the environment they inherit."""
    path = multiprocess_dir() or var_dir / "prometheus" / str(port)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path


_LIVE_FILE = re.compile(r"gauge_live\w*_(\d+)\.db")


def _forget_exited(path: Path) -> None:
    """The live gauges of processes that have exited (a worker that died, or was replaced) leave the sum."""
    for name in os.listdir(path):
        match = _LIVE_FILE.fullmatch(name)
        if match is not None and not _alive(int(match[1])):
            multiprocess.mark_process_dead(int(match[1]), str(path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exposition() -> bytes:
    path = multiprocess_dir()
    if path is None:
        return generate_latest(REGISTRY) + generate_latest(LIVE)
    _forget_exited(path)
    every_process = CollectorRegistry()
    multiprocess.MultiProcessCollector(every_process, str(path))
    return generate_latest(every_process) + generate_latest(LIVE)


_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def exported_names() -> set[str]:
    """The name of every series /metrics can show (a dashboard's queries may use only these)."""
    names: set[str] = set()
    families = [*REGISTRY.collect(), *LIVE.collect(), *SchedulerCollector(lambda: None).describe()]
    for family in families:
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names
