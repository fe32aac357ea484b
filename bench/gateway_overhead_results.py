"""The gateway overhead benchmark's results: what one run measured, its targets, and the step table.

Shared by the benchmark (bench.gateway_overhead) and its two report writers
(bench.gateway_overhead_report for SQLite, bench.gateway_overhead_postgres_report), which import
this module and not each other's.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.gateway_overhead_postgres import Usage
from bench.loadgen import Result, percentile

BACKEND_LATENCY_MS = 50
STEP_RATES = (100, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 2000)
SUSTAIN_ADDED_P99_MS = 50.0
GENERATOR_LAG_LIMIT_MS = 10.0  # p99 of how late the generator started requests: above it, it is the bottleneck
P50_TARGET_MS, P99_TARGET_MS, SUSTAINED_TARGET = 2.0, 10.0, 500
BILLING_RATIO_TARGET = 0.80


@dataclass(frozen=True)
class Phase:
    """One open-loop run summarised (ms)."""

    target: str
    rate_per_s: float
    sent_per_s: float
    ok_share: float
    p50_ms: float | None
    p99_ms: float | None
    lag_p99_ms: float | None
    failures: dict[str, int]
    gateway_cpu_ms_per_request: float | None = None
    stalls_ms: tuple[float, ...] = ()  # the machine's own stalls during the run (bench.canary)

    @classmethod
    def of(cls, target: str, result: Result, cpu_s: float | None = None, stalls_ms=()) -> Phase:
        return cls(
            target,
            result.offered_per_s,
            result.sent_per_s,
            result.ok / result.sent if result.sent else 0.0,
            percentile(result.latencies_ms, 0.50),
            percentile(result.latencies_ms, 0.99),
            percentile(result.send_lag_ms, 0.99),
            dict(result.errors),
            None if cpu_s is None or not result.ok else 1000.0 * cpu_s / result.ok,
            tuple(stalls_ms),
        )


def added(gateway: Phase, direct: Phase, attr: str) -> float | None:
    a, b = getattr(gateway, attr), getattr(direct, attr)
    return None if a is None or b is None else a - b


def sustained(gateway: Phase, direct: Phase) -> bool:
    extra_p99 = added(gateway, direct, "p99_ms")
    generator_kept_up = gateway.lag_p99_ms is not None and gateway.lag_p99_ms < GENERATOR_LAG_LIMIT_MS
    return (
        extra_p99 is not None and extra_p99 < SUSTAIN_ADDED_P99_MS and gateway.ok_share >= 0.999 and generator_kept_up
    )


@dataclass(frozen=True)
class Saturated:
    """One closed-loop run: requests answered per second, and the share of one core the gateway's
    own process (its event loop; not the billing worker) used meanwhile."""

    connections: int
    ok_per_s: float
    busy: float
    usage: Usage | None = None  # PostgreSQL mode: every process of the gateway, its batches
    waits: dict | None = None  # PostgreSQL mode: pg_stat_activity samples of its connections


def ms_cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def mark_cell(ok: bool) -> str:
    return "yes" if ok else "**no**"


def cpu_cell(phase: Phase) -> str:
    value = phase.gateway_cpu_ms_per_request
    return "–" if value is None else f"{value:.2f} ms"


def step_table(name: str, steps: list[tuple[Phase, Phase]]) -> tuple[list[str], int | None]:
    lines = [
        f"| {name}: rate | generator sent | generator lag p99 | direct p99 | gateway p99 | added p99 | answered | "
        "gateway CPU per request | sustained |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    best = None
    for direct, gateway in steps:
        ok = sustained(gateway, direct)
        if ok:
            best = int(gateway.rate_per_s)
        lines.append(
            f"| {gateway.rate_per_s:.0f}/s | {gateway.sent_per_s:.0f}/s | {ms_cell(gateway.lag_p99_ms)} | "
            f"{ms_cell(direct.p99_ms)} | "
            f"{ms_cell(gateway.p99_ms)} | {ms_cell(added(gateway, direct, 'p99_ms'))} | {gateway.ok_share:.1%} | "
            f"{cpu_cell(gateway)} | {mark_cell(ok)} |"
        )
    return lines, best
