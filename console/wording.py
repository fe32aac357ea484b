"""Plain words for the console: class display names, policy terms with a one-line explanation,
SLA in minutes, and audit values as people read them (``field: old → new``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

CLASS_NAMES = {
    "INTERACTIVE": "Interactive",
    "NEAR_RT": "Near real-time",
    "BATCH": "Batch",
    "RETRY": "Retry",
}

TERMS = {
    "level": ("Priority", "Lower is served first: 0 is the most urgent class."),
    "sla": ("Target wait", "How long a request of this class may wait before it starts; aging counts against it."),
    "price_factor": ("Price factor", "The class's charge is the backend's token price times this factor."),
    "aging_mode": ("Aging", "How waiting requests gain priority so no class starves."),
    "segments": (
        "Aging steps",
        "One line per step: the share of the target wait already waited (for example 0.5-0.8), then how "
        "the request gains priority: 0 (not at all), linear or quadratic with a strength k, or preempt "
        "(served before everything else).",
    ),
    "fairness_mode": ("Sharing between departments", "How one class's capacity is shared between departments."),
    "min_share": (
        "Smallest share",
        "The floor of every active department's share, so small ones are never starved (0.02 = 2 %).",
    ),
    "quota_share": ("Share", "The department's weight in fair sharing, between 0 and 1."),
    "slots": ("Slots", "Requests the backend runs at once."),
    "reserved_slots": ("Kept for the top class", "Slots only the most urgent class may use."),
    "tpm": ("Tokens per minute", "The backend's token rate limit; empty for none."),
    "rpm": ("Requests per minute", "The backend's request rate limit; empty for none."),
}

FAIRNESS_MODES = {
    "weighted_fair_tokens": "Fair by tokens used (weighted by share)",
    "weighted_round_robin": "Take turns (weighted by share)",
    "fifo": "First come, first served (no sharing)",
}

AGING_MODES = {
    "piecewise": "In steps (as written below)",
    "linear": "Steadily with the wait",
    "none": "Never (strict priority)",
}

MS_PER_MINUTE = 60_000


def class_label(name: str) -> str:
    """A class's display name: the known ones in words, others as written."""
    return CLASS_NAMES.get(name, name.replace("_", " ").capitalize())


def sla_minutes(sla_ms: int | None) -> str:
    """An SLA in minutes as people write it: 30, 0.5, 2.25 (never 1800000)."""
    if sla_ms is None:
        return "—"
    minutes = Decimal(sla_ms) / MS_PER_MINUTE
    return f"{minutes.quantize(Decimal('0.01')).normalize():f}"


def audit_value(value: Any) -> str:
    """An audited value in words: text as is, lists joined, mappings as ``key value`` pairs."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(audit_value(v) for v in value) or "—"
    if isinstance(value, dict):
        return "; ".join(f"{k} {audit_value(v)}" for k, v in value.items()) or "—"
    return str(value)


def audit_changes(field: str, old: Any, new: Any) -> list[tuple[str, str, str]]:
    """(field, old, new) lines of one audit row: a mapping becomes one line per key that changed."""
    if isinstance(old, dict) or isinstance(new, dict):
        before = old if isinstance(old, dict) else {}
        after = new if isinstance(new, dict) else {}
        lines = [
            (key, audit_value(before.get(key)), audit_value(after.get(key)))
            for key in [*before, *(k for k in after if k not in before)]
            if before.get(key) != after.get(key)
        ]
        if lines:
            return lines
    return [(field, audit_value(old), audit_value(new))]
