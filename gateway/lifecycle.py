"""The names of a request's life in the gateway: its states while live, and how it ended.

An entry (gateway.dispatcher) is ``queued`` or ``running`` while live; once ended its state is its
outcome: one of `Outcome`, or the `gateway.errors.ErrorCode` it was refused or failed with
(``queue_timeout``, ``upstream_error``, ...). Both are StrEnums, so they compare equal to, and
serialise as, the strings the console, the terminal log and the metrics have always shown.
"""

from __future__ import annotations

import secrets
import time
from enum import StrEnum
from typing import NewType

from scheduling.engine.model import RequestId


class State(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"


class Outcome(StrEnum):
    COMPLETED = "completed"  # served in full
    CANCELLED = "cancelled"  # the client left (a stream cut short by the client is charged for what it got)
    UPSTREAM_REJECTED = "upstream_rejected"  # the backend answered 4xx: relayed, not charged
    EARLY_HOLD_REFUSED = "early_hold_refused"  # its early hold was refused (billing.client): admitted again


PublicId = NewType("PublicId", str)
"""A request's id as its client knows it: its ``X-Request-Id``, or one made for it (``req_...``).
Unique only within its tenant; the engine and the ledger key a request by `engine_id`."""


def ordered_id(prefix: str, random_bytes: int) -> str:
    """``prefix`` + the time in ms (12 hex digits) + ``random_bytes`` random bytes in hex: ids made
    in time order keep an index on them appending at its end instead of writing all over it (and a
    listing by id is a listing by age)."""
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{secrets.token_hex(random_bytes)}"


def engine_id(tenant: str, public_id: PublicId) -> RequestId:
    """The request's key in the engine and the ledger: ``tenant/public id``."""
    return RequestId(f"{tenant}/{public_id}")


def public_id_of(key: str) -> PublicId:
    """The client's id in an engine id."""
    return PublicId(key.partition("/")[2])


UNTAGGED_JOB = "key/"  # "/" is not allowed in an X-Job-Id: an untagged group never meets a client's job


def job_of(*, tagged: str | None, key_prefix: str, cls: str) -> str:
    """A request's job: the client's ``X-Job-Id``, else its API key's and class's group
    (``key/<prefix>/<class>``): the console shows the requests of one job as one card."""
    return tagged if tagged else f"{UNTAGGED_JOB}{key_prefix}/{cls}"
