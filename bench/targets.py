"""Issue 3's targets on ``surge``, checked against one report run, with the reason when missed.

Each check returns ``(label, ours, goal, met, why)``; ``why`` is empty when the target is met.
"""

from __future__ import annotations

from typing import NamedTuple

Results = dict[str, dict]  # policy -> simulate JSON


class Check(NamedTuple):
    label: str
    ours: str
    goal: str
    met: bool
    why: str


def _p95(out: dict, cls: str) -> float:
    return out["classes"][cls]["wait_ms"]["p95"]


def _batch_within_sla(out: dict) -> float:
    batch = out["classes"]["BATCH"]
    return batch["completed_within_sla"] / batch["admitted"] if batch["admitted"] else 1.0


def interactive_checks(runs: Results) -> list[Check]:
    ours, strict, fifo = (_p95(runs[p], "INTERACTIVE") for p in ("fairgate", "strict", "fifo"))
    why_strict = (
        ""
        if ours <= 1.1 * strict
        else (
            "aging lets aged NEAR_RT (and BATCH past wait_ratio 0.8) compete with fresh chat requests; "
            f"{runs['fairgate']['aging']['preempted']} requests were dispatched at preempt"
        )
    )
    return [
        Check(
            "interactive p95 <= 1.1x strict",
            f"{ours / 1000:.2f} s",
            f"<= {1.1 * strict / 1000:.2f} s",
            ours <= 1.1 * strict,
            why_strict,
        ),
        Check(
            "interactive p95 < 1/20 of fifo",
            f"{ours / 1000:.2f} s",
            f"< {fifo / 20000:.2f} s",
            ours < fifo / 20,
            "" if ours < fifo / 20 else "fifo's backlog is shorter than the gap needs",
        ),
    ]


def batch_checks(runs: Results) -> list[Check]:
    out = runs["fairgate"]
    within = _batch_within_sla(out)
    full = out["totals"]["queue_full_ratio"]
    return [
        Check(
            "BATCH completed within SLA >= 99.5% of admitted",
            f"{within:.2%}",
            ">= 99.50%",
            within >= 0.995,
            ""
            if within >= 0.995
            else f"{out['classes']['BATCH']['queue_timeout']} BATCH requests timed out: "
            "the capacity left by the higher classes could not serve them within the SLA",
        ),
        Check(
            "queue_full <= 0.3% of arrivals",
            f"{full:.2%}",
            "<= 0.30%",
            full <= 0.003,
            "" if full <= 0.003 else "the depth limit refused part of the burst",
        ),
    ]


def fairness_checks(runs: Results) -> list[Check]:
    ours, fifo = (runs[p]["small_tenants"]["wait_ms"]["mean"] for p in ("fairgate", "fifo"))
    jain, samples = runs["fairgate"]["jain_index"], runs["fairgate"]["jain_samples"]
    jain_met = jain is not None and jain >= 0.95
    why_jain = (
        ""
        if jain_met
        else (
            "no window had two tenants backlogged in one class"
            if jain is None
            else "requests at preempt are served earliest-deadline-first, bypassing tenant fairness"
        )
    )
    return [
        Check(
            "small tenants' mean wait <= 1/12 of fifo",
            f"{ours / 1000:.2f} s",
            f"<= {fifo / 12000:.2f} s",
            ours <= fifo / 12,
            "" if ours <= fifo / 12 else "see the small-tenant scenario's findings",
        ),
        Check("Jain index >= 0.95", f"{jain} ({samples} windows)", ">= 0.95", jain_met, why_jain),
    ]


def efficiency_checks(runs: Results) -> list[Check]:
    wasted = runs["fairgate"]["wasted_service_ratio"]
    ours, fifo = (runs[p]["goodput_per_s"] for p in ("fairgate", "fifo"))
    return [
        Check(
            "wasted service < 1%",
            f"{wasted:.2%}",
            "< 1.00%",
            wasted < 0.01,
            "" if wasted < 0.01 else "requests were served after their client gave up",
        ),
        Check(
            "goodput >= fifo's",
            f"{ours}/s",
            f">= {fifo}/s",
            ours >= fifo,
            "" if ours >= fifo else "more requests timed out or were refused than fifo wasted",
        ),
    ]


def speed_checks(speed: list[dict] | None) -> list[Check]:
    if not speed:
        return []
    row = next((r for r in speed if r["waiting"] == 20_000), None)
    if row is None:
        return []
    p99, ratio = row["decision_p99_us"], row["ratio"]
    return [
        Check(
            "decision p99 <= 20 us at 20,000 waiting",
            f"{p99:.1f} us",
            "<= 20 us",
            p99 <= 20,
            "" if p99 <= 20 else "see engine_speed: the dispatch path at this depth",
        ),
        Check(
            "ratio to heapq push+pop <= 10x",
            f"{ratio:.1f}x",
            "<= 10x",
            ratio <= 10,
            ""
            if ratio <= 10
            else "a dispatch does far more than a heap pop: aging rank over classes, "
            "fair-share heap per lane, capacity and window checks, counters, store writes",
        ),
    ]


def surge_checks(runs: Results, speed: list[dict] | None) -> list[Check]:
    return (
        interactive_checks(runs)
        + batch_checks(runs)
        + fairness_checks(runs)
        + efficiency_checks(runs)
        + speed_checks(speed)
    )
