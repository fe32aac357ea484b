"""Timing and capacity of the simulated GPU: slots, TPM/RPM windows, counters.

Plain Python with the time passed in (``now_ms``), so it is testable without a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from .config import SimConfig

RECENT_IDS_KEPT = 10_000
RECENT_IDS_SHOWN = 1_000


@dataclass(frozen=True)
class ServicePlan:
    """How long one request holds a slot: prefill (time to first token) then decode."""

    prompt_tokens: int
    completion_tokens: int
    prefill_ms: float
    decode_ms: float

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.decode_ms

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def plan_service(config: SimConfig, *, prompt_tokens: int, completion_tokens: int, choices: int = 1) -> ServicePlan:
    """Prefill grows with prompt size past one unit; decode is output tokens at the decode speed
    (``choices`` decode side by side, as a batch on the GPU)."""
    if config.fixed_latency_ms is not None:
        prefill_ms, decode_ms = config.fixed_latency_ms, 0.0
    else:
        prompt_units = max(1.0, prompt_tokens / config.prefill_unit_tokens)
        prefill_ms = config.ttft_ms * prompt_units
        decode_ms = math.ceil(completion_tokens / choices) * 1000.0 / config.tokens_per_s
    return ServicePlan(prompt_tokens, completion_tokens, prefill_ms, decode_ms)


@dataclass(frozen=True)
class Rejection:
    """Why a request was refused with 429, and when it is worth trying again."""

    reason: str  # "slots" | "tpm" | "rpm"
    retry_after_ms: float
    message: str


class SlidingWindow:
    """Amounts added in the last ``window_ms``, against a limit (0 = unlimited)."""

    def __init__(self, *, limit: int, window_ms: float) -> None:
        self.limit = limit
        self.window_ms = window_ms
        self._entries: deque[tuple[float, int]] = deque()
        self._used = 0

    def used(self, now_ms: float) -> int:
        self._evict(now_ms)
        return self._used

    def wait_ms_for(self, amount: int, now_ms: float) -> float:
        """0 when ``amount`` fits now, else ms until enough expires (a window if it never fits)."""
        if self.limit <= 0:
            return 0.0
        if amount > self.limit:
            return self.window_ms
        self._evict(now_ms)
        excess = self._used + amount - self.limit
        if excess <= 0:
            return 0.0
        for added_ms, entry_amount in self._entries:
            excess -= entry_amount
            if excess <= 0:
                return max(1.0, added_ms + self.window_ms - now_ms)
        return self.window_ms  # unreachable while amount <= limit

    def add(self, amount: int, now_ms: float) -> None:
        if self.limit <= 0:
            return
        self._entries.append((now_ms, amount))
        self._used += amount

    def _evict(self, now_ms: float) -> None:
        horizon_ms = now_ms - self.window_ms
        entries = self._entries
        while entries and entries[0][0] <= horizon_ms:
            self._used -= entries.popleft()[1]


class Capacity:
    """Slots in use plus the TPM and RPM windows; admission is all-or-nothing."""

    def __init__(self, config: SimConfig) -> None:
        self.slots = config.slots
        self.tokens = SlidingWindow(limit=config.tpm, window_ms=config.window_ms)
        self.requests = SlidingWindow(limit=config.rpm, window_ms=config.window_ms)
        self._busy_until_ms: dict[int, float] = {}

    @property
    def in_flight(self) -> int:
        return len(self._busy_until_ms)

    def try_admit(self, lease_id: int, plan: ServicePlan, now_ms: float) -> Rejection | None:
        """Take a slot and reserve the plan's tokens, or say why not."""
        rejection = self._check(plan, now_ms)
        if rejection is not None:
            return rejection
        self._busy_until_ms[lease_id] = now_ms + plan.total_ms
        self.tokens.add(plan.total_tokens, now_ms)
        self.requests.add(1, now_ms)
        return None

    def release(self, lease_id: int) -> None:
        self._busy_until_ms.pop(lease_id, None)

    def _check(self, plan: ServicePlan, now_ms: float) -> Rejection | None:
        if len(self._busy_until_ms) >= self.slots:
            soonest_ms = min(self._busy_until_ms.values())
            return Rejection(
                "slots",
                max(1.0, soonest_ms - now_ms),
                f"All {self.slots} slots of the simulated backend are busy; retry shortly.",
            )
        wait_ms = self.requests.wait_ms_for(1, now_ms)
        if wait_ms > 0:
            return Rejection("rpm", wait_ms, f"Rate limit of {self.requests.limit} requests per minute reached.")
        wait_ms = self.tokens.wait_ms_for(plan.total_tokens, now_ms)
        if wait_ms > 0:
            return Rejection(
                "tpm",
                wait_ms,
                f"Rate limit of {self.tokens.limit} tokens per minute reached "
                f"(request needs {plan.total_tokens} tokens).",
            )
        return None


class SimStats:
    """Counters shown at GET /stats; the gateway's tests read them to see what arrived."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.completed = 0
        self.cancelled = 0
        self.max_in_flight = 0
        self.rejected_slots = 0
        self.rejected_tpm = 0
        self.rejected_rpm = 0
        self.failed = 0
        self.bad_requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.recent_request_ids: deque[str] = deque(maxlen=RECENT_IDS_KEPT)

    def record_arrival(self, request_id: str | None) -> None:
        self.requests += 1
        if request_id is not None:
            self.recent_request_ids.append(request_id)

    def record_rejection(self, rejection: Rejection) -> None:
        if rejection.reason == "slots":
            self.rejected_slots += 1
        elif rejection.reason == "tpm":
            self.rejected_tpm += 1
        else:
            self.rejected_rpm += 1

    def record_admitted(self, in_flight: int) -> None:
        if in_flight > self.max_in_flight:
            self.max_in_flight = in_flight

    def record_done(self, plan: ServicePlan, *, cancelled: bool) -> None:
        self.prompt_tokens += plan.prompt_tokens
        self.completion_tokens += plan.completion_tokens
        if cancelled:
            self.cancelled += 1
        else:
            self.completed += 1

    def has_seen(self, request_id: str) -> bool:
        return request_id in self.recent_request_ids

    def snapshot(self, capacity: Capacity, now_ms: float) -> dict[str, Any]:
        shown = list(self.recent_request_ids)[-RECENT_IDS_SHOWN:]
        return {
            "requests": self.requests,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "in_flight": capacity.in_flight,
            "max_in_flight": self.max_in_flight,
            "slots": capacity.slots,
            "rejected_429": self.rejected_slots + self.rejected_tpm + self.rejected_rpm,
            "rejected_slots": self.rejected_slots,
            "rejected_tpm": self.rejected_tpm,
            "rejected_rpm": self.rejected_rpm,
            "failed": self.failed,
            "bad_requests": self.bad_requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "tpm_limit": capacity.tokens.limit,
            "tpm_window_tokens": capacity.tokens.used(now_ms),
            "rpm_limit": capacity.requests.limit,
            "rpm_window_requests": capacity.requests.used(now_ms),
            "recent_request_ids": shown,
        }
