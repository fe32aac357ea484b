"""Prometheus metrics of the billing client (the gateway's side of billing), in a registry of
their own that the gateway serves with its own (gateway.apps) (and, under ``serve --workers N``, writes to
the multiprocess directory like every other)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=False)
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
BILLING_WORKER_REPLACEMENTS = Counter(
    "fairgate_billing_worker_replacements",
    "Billing workers that ended unexpectedly (the next batch starts a new one).",
    registry=REGISTRY,
)
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
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
