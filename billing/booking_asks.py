"""What is asked of booking (billing.booking): holds, settlements and releases, their results,
the ledger entries they write, and the reasons and attempt keys they are booked under."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from billing.inflight import HeldEntry
from billing.models import LedgerEntry
from billing.money import ZERO
from billing.wire import pickled_as_tuple

STALE_REASON = "stale"  # no owner to ask, released by age: a late settlement still charges what was consumed
OWNER_GONE_REASON = "owner_gone"  # released because its gateway process died (billing.heartbeats)
FORCED_REASON = "forced"  # released by an operator (`manage.py ledger release-forced`)
LATE_SETTLEMENT_REASONS = frozenset({STALE_REASON, OWNER_GONE_REASON, FORCED_REASON})
MAX_ATTEMPTS = 64  # requests one id may name: an id whose request ended unserved may be sent again


@pickled_as_tuple
class HoldAsk(NamedTuple):
    request_id: str
    tenant_slug: str
    class_name: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    at: datetime
    fallback: bool = False  # may fall back to a cheaper class if the tenant is configured to
    owner: str = ""  # the gateway process asking (billing.heartbeats); empty: not a gateway's request
    # The time whose price versions apply (a batch line: its batch's creation, batches.prices); None: ``at``.
    priced_at: datetime | None = None
    hold_cap: Decimal | None = None  # held at most this (a batch line: its part of its batch's cost bound)
    # Who spends (ledger columns, copied to the hold's end): the key's prefix, the job, the key's creator.
    key_prefix: str = ""
    job_id: str = ""
    key_creator: str = ""


@pickled_as_tuple
class SettleAsk(NamedTuple):
    request_id: str
    backend_name: str
    prompt_tokens: int
    completion_tokens: int
    at: datetime
    # The unrounded base cost, priced by the gateway that told its client the charge (X-Charge)
    # from the backend's prices it had; None: priced here, from the backend's prices now.
    base_cost: Decimal | None = None
    held: HeldEntry | None = None  # the hold it ends, as booked; None: from this process's memo, else the ledger


@pickled_as_tuple
class ReleaseAsk(NamedTuple):
    request_id: str
    reason: str
    at: datetime
    held: HeldEntry | None = None  # as for SettleAsk


Ask = HoldAsk | SettleAsk | ReleaseAsk


@pickled_as_tuple
class Charged(NamedTuple):
    """A settlement's result: what was charged, and what the usage priced beyond what could be."""

    amount: Decimal
    unbilled: Decimal = ZERO


class Booked(NamedTuple):
    """One ledger entry as appended (the columns of LedgerEntry but its id), in the order of
    COLUMNS: the row the append writes as it is (a frozen dataclass of 23 fields cost the billing
    worker about 3 us to make, three times per request)."""

    kind: str
    at: datetime
    tenant_id: int
    budget_id: int
    month_budget_id: int | None
    request_id: str
    class_name: str
    price_version_id: int | None
    model: str
    amount: Decimal
    factor: Decimal
    backend_name: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    base_cost: Decimal = ZERO
    overrun: Decimal = ZERO
    unbilled: Decimal = ZERO
    owner: str = ""
    reason: str = ""
    author: str = ""
    key_prefix: str = ""
    job_id: str = ""
    key_creator: str = ""


COLUMNS = Booked._fields
assert set(COLUMNS) == {f.attname for f in LedgerEntry._meta.concrete_fields if not f.primary_key}


def attempt_key(request_id: str, attempt: int) -> str:
    """The ledger's key of the ``attempt``-th request sent with one id: the id itself, then ``id#2``..."""
    return request_id if attempt == 1 else f"{request_id}#{attempt}"


def attempt_of(key: str) -> str:
    """The request id an attempt's key was made from (ids never contain ``#``)."""
    return key.split("#", 1)[0]
