"""The names of a request's life in the gateway: its states while live, and how it ended.

An entry (gateway.dispatcher) is ``queued`` or ``running`` while live; once ended its state is its
outcome: one of `Outcome`, or the `gateway.errors.ErrorCode` it was refused or failed with
(``queue_timeout``, ``upstream_error``, ...). Both are StrEnums, so they compare equal to, and
serialise as, the strings the console, the terminal log and the metrics have always shown.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"


class Outcome(StrEnum):
    COMPLETED = "completed"  # served in full
    CANCELLED = "cancelled"  # the client left (a stream cut short by the client is charged for what it got)
    UPSTREAM_REJECTED = "upstream_rejected"  # the backend answered 4xx: relayed, not charged
    EARLY_HOLD_REFUSED = "early_hold_refused"  # its early hold was refused (gateway.charging): admitted again
