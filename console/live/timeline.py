"""The operations timeline: a ring buffer of samples in the field report's shape
(in_queue, interactive p95, batch completed, aging preempts), and wait percentiles from the
engine's cumulative wait histograms. Plain Python: samples are handed in, nothing is read here."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Sample:
    at_ms: int  # wall-clock epoch ms (for the chart's axis)
    in_queue: int
    interactive_p95_ms: int | None  # wait p95 of the top class over the last sample interval
    batch_completed: int  # cumulative since the process started
    aging_preempts: int  # cumulative


def p95_ms(hist: list[int], buckets_ms: tuple[int, ...]) -> int | None:
    """Upper bound of the bucket holding the 95th percentile (None when the histogram is empty).
    The open last bucket answers its lower bound."""
    total = sum(hist)
    if total == 0:
        return None
    needed = 0.95 * total
    running = 0
    for index, count in enumerate(hist):
        running += count
        if running >= needed:
            return buckets_ms[index] if index < len(buckets_ms) else buckets_ms[-1]
    return buckets_ms[-1]


class Timeline:
    def __init__(self, *, step_ms: int, span_ms: int = HOUR_MS) -> None:
        self.step_ms = step_ms
        self.samples: deque[Sample] = deque(maxlen=max(1, span_ms // step_ms))

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def as_rows(self) -> list[dict]:
        return [asdict(s) for s in self.samples]
