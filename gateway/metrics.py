"""Prometheus metrics of the gateway, in a registry of its own (served at /metrics).

Event counts measured at the gateway are plain counters; scheduler state (depths, limits,
aging, backend slots) is read at scrape time from the dispatcher by a collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

REGISTRY = CollectorRegistry(auto_describe=False)
WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600)

REJECTS = Counter("fairgate_rejects", "Requests answered with an error, by code.", ["code"], registry=REGISTRY)
DOWNGRADES = Counter("fairgate_downgrades", "Class downgrades, by rule.", ["rule"], registry=REGISTRY)
UPSTREAM_ERRORS = Counter(
    "fairgate_upstream_errors", "Upstream failures, by backend and kind.", ["backend", "kind"], registry=REGISTRY
)
WAIT = Histogram(
    "fairgate_queue_wait_seconds",
    "Time from admission to dispatch, by class.",
    ["cls"],
    buckets=WAIT_BUCKETS_S,
    registry=REGISTRY,
)
BILLING_BATCH_ASKS = Histogram(
    "fairgate_billing_batch_asks",
    "Holds, settlements and releases booked per transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=REGISTRY,
)
BILLING_BATCH_SECONDS = Histogram(
    "fairgate_billing_batch_seconds",
    "Time to book one batch (its transaction).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
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
BILLING_WORKER_REPLACEMENTS = Counter(
    "fairgate_billing_worker_replacements",
    "Billing workers that ended unexpectedly (the next batch starts a new one).",
    registry=REGISTRY,
)
INTAKE_WAITING = Gauge(
    "fairgate_intake_waiting",
    "Requests waiting for a turn at intake (gateway.lanes), by declared class.",
    ["cls"],
    registry=REGISTRY,
)
COMPLETED = Counter("fairgate_requests_completed", "Requests served, by class.", ["cls"], registry=REGISTRY)
BILLING_EARLY_HOLDS = Counter(
    "fairgate_billing_early_holds",
    "Holds booked while their requests went on "
    "(gateway.charging), by answer: booked, or refused (the request was admitted again, "
    "hold first)",
    ["outcome"],
    registry=REGISTRY,
)
BILLING_UNBILLED = Counter(
    "fairgate_billing_unbilled",
    "What backends' usage priced beyond what could be charged "
    "(beyond the hold), in the billing currency; the ledger's unbilled column has each.",
    registry=REGISTRY,
)
BILLING_UNBOOKED = Gauge(
    "fairgate_billing_unbooked",
    "Settlements and releases that could not be booked yet "
    "(the database is out): kept (settlements in the local journal) and retried.",
    registry=REGISTRY,
)


class SchedulerCollector:
    """Reads ``snapshot()`` of the running dispatcher; nothing when none is running."""

    def __init__(self, snapshot: Callable[[], dict | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        if snap is None:
            return
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
    REGISTRY.register(SchedulerCollector(snapshot))


def exposition() -> bytes:
    return generate_latest(REGISTRY)
