"""The Batch API's metrics, in the gateway's registries (served at /metrics): batches by status and
lines by state, counted in the database by each serving process's feeder every ``TALLY_S`` (a
scrape reads the last count: at most that old), and the lines this process sent again because
their lease lapsed (batches.leases)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from batches import service
from batches.models import Batch, BatchLine
from gateway.api import LIVE, REGISTRY

TALLY_S = 5.0
RESENT = Counter(
    "fairgate_batch_lines_resent",
    "Batch lines sent to the workers again because their lease lapsed (a worker died, or none took them up).",
    registry=REGISTRY,
)
_tally: dict[str, dict[str, int]] | None = None


def refresh() -> None:
    """Counts again (synchronous: the feeder runs it off the event loop)."""
    global _tally
    _tally = service.batches_tally()


class _Collector:
    def collect(self) -> Iterator[Metric]:
        tally = _tally
        if tally is None:  # not counted yet (or not a serving process)
            return
        batches = GaugeMetricFamily("fairgate_batches", "Batches by status.", labels=["status"])
        for status in Batch.Status.values:
            batches.add_metric([status], tally["batches"].get(status, 0))
        lines = GaugeMetricFamily(
            "fairgate_batch_lines",
            "Batch lines by state: pending and claimed wait (in their batch, in an engine), sent run, the rest ended.",
            labels=["state"],
        )
        for state in BatchLine.State.values:
            lines.add_metric([state], tally["lines"].get(state, 0))
        yield from (batches, lines)


LIVE.register(_Collector())
