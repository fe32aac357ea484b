"""The field report's surge as a time-compressed live replay: what is sent, when, and how big.

The event (sim/scenarios/surge.json, where the parameters are argued): from 08:30 twenty
departments keep up chat (INTERACTIVE, ~2.8/s) and near-real-time traffic (NEAR_RT, ~1.2/s);
at 09:00 finance submits 12,400 BATCH requests at once. The GPU pool has 48 slots; chat holds a
slot ~4.3 s, near-RT ~7 s, batch ~20 s, so the batch drains in about three hours.

Two knobs shrink it to fit a laptop:

* ``time_scale`` (default 60): one real second is ``time_scale`` simulated seconds. Arrival
  rates are multiplied by it, and the backend's timings, the classes' SLAs and the clients'
  patience are divided by it (the caller configures the backend and gateway accordingly:
  ``backend_options``, ``sla_ms``).
* ``load_scale`` (default ``batch_count / 12400``): the event's *size*. Arrival rates and the
  backend's slots are multiplied by it, so the pool is as busy, and the batch drains in the
  same simulated time, as in the full event.

This module is plain Python (no Django): the command and ``bench.surge_compare`` share it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

FIELD_BATCH_COUNT = 12_400
FIELD_SLOTS = 48
INTERACTIVE_PER_S = 2.82  # simulated; 11 departments x 0.22/s + 8 small ones x 0.05/s
NEAR_RT_PER_S = 1.24  # 10 x 0.10/s + 8 x 0.03/s
SURGE_AT_S = 9 * 3600  # 09:00
# The field report's surge timeline: time, in_queue, interactive p95 (s), batch_completed, aging_preempt.
FIELD_TIMELINE = (
    ("09:00", 143, 1.12, 0, 0),
    ("09:05", 11_872, 1.31, 412, 0),
    ("09:20", 10_105, 1.28, 2_338, 17),
    ("10:00", 6_442, 1.35, 6_001, 186),
    ("11:30", 917, 1.19, 11_483, 742),
    ("12:10", 0, 1.08, 12_400, 803),
)
REPORT_TIMES = tuple(row[0] for row in FIELD_TIMELINE)  # the field report's rows
FIELD_P95_S = {row[0]: row[2] for row in FIELD_TIMELINE}  # its interactive p95 at each of them

# The simulated GPU: prefill per 512 prompt tokens and decode speed, in simulated time; with
# the request shapes below, chat holds a slot ~4.3 s, near-RT ~7 s, batch ~19 s (surge.json).
TTFT_MS_PER_512 = 150.0
DECODE_TOKENS_PER_S = 25.0


@dataclass(frozen=True)
class Shape:
    """Request sizes of one kind of traffic (uniform ranges, tokens)."""

    prompt_tokens: tuple[int, int]
    max_tokens: tuple[int, int]


CHAT = Shape(prompt_tokens=(200, 3000), max_tokens=(50, 140))
NEAR_RT = Shape(prompt_tokens=(500, 4000), max_tokens=(100, 220))
BATCH = Shape(prompt_tokens=(500, 4000), max_tokens=(200, 700))


@dataclass(frozen=True)
class SurgePlan:
    batch_count: int = FIELD_BATCH_COUNT
    time_scale: float = 60.0
    load_scale: float | None = None  # None: batch_count / 12,400
    model: str = "m"
    warmup_sim_s: float = 300.0  # traffic starts at 08:55
    step_sim_s: float = 300.0  # a progress line and a timeline sample every 5 simulated minutes
    patience_sim_s: tuple[float, float] = (20.0, 60.0)  # chat users give up (field report's story)
    max_sim_s: float = 5 * 3600.0  # stop at 14:00 even if the batch has not drained
    max_open_batch: int = 2000  # open connections of the batch submitter
    batch_spread_sim_s: float = 120.0  # the batch arrives within 2 simulated minutes (surge.json)
    seed: int = 1

    def __post_init__(self) -> None:
        if self.batch_count < 1 or self.time_scale <= 0 or self.max_open_batch < 1:
            raise ValueError("batch_count, time_scale and max_open_batch must be positive")
        if self.load_scale is not None and self.load_scale <= 0:
            raise ValueError("load_scale must be positive")

    @property
    def scale(self) -> float:
        return self.load_scale if self.load_scale is not None else self.batch_count / FIELD_BATCH_COUNT

    @property
    def interactive_per_real_s(self) -> float:
        return INTERACTIVE_PER_S * self.scale * self.time_scale

    @property
    def near_rt_per_real_s(self) -> float:
        return NEAR_RT_PER_S * self.scale * self.time_scale

    def real_s(self, sim_s: float) -> float:
        return sim_s / self.time_scale

    def sim_s(self, real_s: float) -> float:
        return real_s * self.time_scale

    @property
    def start_clock_s(self) -> float:
        return SURGE_AT_S - self.warmup_sim_s

    def clock(self, sim_s_since_start: float) -> str:
        """Wall clock of the simulated day (08:55 + elapsed)."""
        total_min = int((self.start_clock_s + sim_s_since_start) // 60)
        return f"{total_min // 60:02d}:{total_min % 60:02d}"

    def since_start(self, clock: str) -> float:
        hours, minutes = clock.split(":")
        return int(hours) * 3600 + int(minutes) * 60 - self.start_clock_s

    def backend_options(self) -> dict[str, float | int]:
        """Options of ``python -m simbackend`` that match this plan."""
        return {
            "slots": max(1, round(FIELD_SLOTS * self.scale)),
            "ttft_ms": TTFT_MS_PER_512 / self.time_scale,
            "tokens_per_s": DECODE_TOKENS_PER_S * self.time_scale,
        }

    def sla_ms(self, sim_sla_ms: int) -> int:
        """A class SLA of the simulated day in real milliseconds."""
        return max(1, math.ceil(sim_sla_ms / self.time_scale))

    def describe(self) -> str:
        slots = self.backend_options()["slots"]
        return (
            f"time scale {self.time_scale:g} (1 real s = {self.time_scale:g} simulated s); load scale "
            f"{self.scale:.3g} of the field event: {self.batch_count:,} batch requests (field: "
            f"{FIELD_BATCH_COUNT:,}), {slots} backend slots (field: {FIELD_SLOTS}), chat "
            f"{INTERACTIVE_PER_S * self.scale:.2f}/s + near-RT {NEAR_RT_PER_S * self.scale:.2f}/s simulated "
            f"= {self.interactive_per_real_s + self.near_rt_per_real_s:.0f} requests/s real; at most "
            f"{self.max_open_batch:,} batch requests open at once, the batch sent within "
            f"{self.batch_spread_sim_s / 60:g} simulated minutes"
        )


class Prompts:
    """Prompt texts of a wanted size, cut from one pre-made text (cheap to send many)."""

    WORDS = (
        "ledger",
        "quarter",
        "invoice",
        "revenue",
        "policy",
        "customer",
        "report",
        "budget",
        "region",
        "forecast",
        "margin",
        "vendor",
        "audit",
        "summary",
        "account",
        "balance",
        "growth",
        "review",
    )

    def __init__(self, seed: int, max_tokens: int = 4000) -> None:
        rng = random.Random(seed)
        self.words = [rng.choice(self.WORDS) for _ in range(max_tokens)]
        self._text = " ".join(self.words)
        self._ends = []  # character offset after each word
        offset = -1
        for word in self.words:
            offset += len(word) + 1
            self._ends.append(offset)

    def text(self, tokens: int) -> str:
        """About ``tokens`` tokens (one per word for these words in cl100k_base)."""
        tokens = max(1, min(tokens, len(self._ends)))
        return self._text[: self._ends[tokens - 1]]
