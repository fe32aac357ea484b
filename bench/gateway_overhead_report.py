"""The gateway overhead benchmark's results as the markdown section of bench/REPORT-gateway.md."""

from __future__ import annotations

import os
from statistics import mean

from bench.gateway_overhead_results import (
    BACKEND_LATENCY_MS,
    BILLING_RATIO_TARGET,
    GENERATOR_LAG_LIMIT_MS,
    P50_TARGET_MS,
    P99_TARGET_MS,
    STEP_RATES,
    SUSTAIN_ADDED_P99_MS,
    SUSTAINED_TARGET,
    Phase,
    Saturated,
    added,
    cpu_cell,
    mark_cell,
    ms_cell,
    step_table,
)


def _failed(phase: Phase) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(phase.failures.items())) or "0"


def _load(found: dict) -> str:
    before, after = found.get("load_avg", (None, None))
    if before is None:
        return ""
    return (
        f" (1-minute load average {before:.1f} before the run, {after:.1f} after: other work on the machine "
        "skews the tails)"
    )


def latency_table(rows: list[tuple[Phase, Phase, Phase]]) -> list[str]:
    lines = [
        "| rate | generator sent | direct p50 / p99 | gateway | gateway p50 / p99 | added p50 | added p99 | "
        "gateway CPU per request | failed | target (at 100/s: p50 <= 2 ms, p99 <= 10 ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for direct, *gateways in rows:
        for gateway in gateways:
            extra50, extra99 = added(gateway, direct, "p50_ms"), added(gateway, direct, "p99_ms")
            verdict = ""
            if direct.rate_per_s == 100:
                ok = (
                    extra50 is not None
                    and extra50 <= P50_TARGET_MS
                    and extra99 is not None
                    and extra99 <= P99_TARGET_MS
                    and gateway.ok_share >= 0.999
                )
                verdict = mark_cell(ok)
            lines.append(
                f"| {direct.rate_per_s:.0f}/s | {gateway.sent_per_s:.0f}/s | {ms_cell(direct.p50_ms)} / "
                f"{ms_cell(direct.p99_ms)} | {gateway.target} | {ms_cell(gateway.p50_ms)} / "
                f"{ms_cell(gateway.p99_ms)} | "
                f"{ms_cell(extra50)} | {ms_cell(extra99)} | {cpu_cell(gateway)} | {_failed(gateway)} | {verdict} |"
            )
    return lines


def render(found: dict) -> str:
    parts = [
        "## Gateway overhead (`python -m bench.gateway_overhead`)",
        "",
        f"One simulated backend answering after a fixed {BACKEND_LATENCY_MS} ms, one gateway process with "
        "billing on and one with billing off (`FAIRGATE_BILLING=0`), each `manage.py serve` (uvicorn, "
        "httptools, uvloop) on SQLite; the load generator is a third process (raw asyncio streams on "
        f"uvloop). Small non-streaming chat requests, Poisson arrivals; {os.cpu_count()} CPU cores shared "
        "by all three processes" + _load(found) + ". Added = gateway percentile - direct percentile at "
        "the same rate.",
        "",
        "### Added latency",
        "",
    ]
    parts += latency_table(found["latency"])
    rates_stepped = found.get("rates", STEP_RATES)
    if rates_stepped:
        parts += _sustained(found["steps"], rates_stepped)
    if any(found["saturation"].values()):
        parts += [""] + saturation_table(found["saturation"])
    return "\n".join(parts) + "\n"


def _sustained(steps_by_name: dict, rates_stepped: tuple[int, ...]) -> list[str]:
    parts = [
        "",
        f"### Highest sustained rate (added p99 < {SUSTAIN_ADDED_P99_MS:.0f} ms, >= 99.9% answered, "
        f"generator's send lag p99 < {GENERATOR_LAG_LIMIT_MS:.0f} ms; steps "
        f"{', '.join(map(str, rates_stepped))} requests/s)",
        "",
    ]
    bests = {}
    for name, steps in steps_by_name.items():
        lines, bests[name] = step_table(name, steps)
        parts += lines + [""]
    for name, best in bests.items():
        shown = f"{best}/s" if best else f"below {rates_stepped[0]}/s"
        parts.append(
            f"- {name}: sustains {shown} (target >= {SUSTAINED_TARGET}/s: "
            f"{mark_cell(bool(best) and best >= SUSTAINED_TARGET)})"
        )
    return parts


def _by_connections(runs: list[Saturated]) -> dict[int, tuple[float, float]]:
    """connections -> (mean requests/s, mean busy share) over the rounds."""
    out = {}
    for clients in sorted({r.connections for r in runs}):
        mine = [r for r in runs if r.connections == clients]
        out[clients] = (mean(r.ok_per_s for r in mine), mean(r.busy for r in mine))
    return out


def saturation_table(runs: dict[str, list[Saturated]]) -> list[str]:
    on, off = _by_connections(runs["billing on"]), _by_connections(runs["billing off"])
    rounds = len(runs["billing on"]) // max(len(on), 1)
    lines = [
        f"### Billing on vs off (closed loop, means of {rounds} alternated runs per cell)",
        "",
        "| connections | billing on | its process busy | billing off | its process busy | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for clients in on:
        (rate_on, busy_on), (rate_off, busy_off) = on[clients], off.get(clients, (0.0, 0.0))
        lines.append(
            f"| {clients} | {rate_on:.0f}/s | {busy_on:.0%} | {rate_off:.0f}/s | {busy_off:.0%} | "
            f"{rate_on / rate_off if rate_off else 0:.0%} |"
        )
    peak_on = max(on.items(), key=lambda kv: kv[1][0])
    peak_off = max(off.items(), key=lambda kv: kv[1][0])
    ratio = peak_on[1][0] / peak_off[1][0] if peak_off[1][0] else 0.0
    lines += [
        "",
        f"- throughput, the peak over the concurrencies: billing on {peak_on[1][0]:.0f}/s "
        f"({peak_on[0]} connections), billing off {peak_off[1][0]:.0f}/s ({peak_off[0]} connections): "
        f"**{ratio:.0%}** (target >= {BILLING_RATIO_TARGET:.0%}: {mark_cell(ratio >= BILLING_RATIO_TARGET)})",
        '- "its process busy": the share of one core the gateway\'s own process used (its event loop, '
        "not the billing worker). Near 100% the gateway is saturated; well below, the clients are too few "
        "to keep it busy: each waits for its requests, and with billing on every request also waits for "
        "its hold and its settlement to be booked (Little's law: the same clients then send fewer "
        "requests per second).",
    ]
    return lines
