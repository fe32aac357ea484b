"""Billing's one public client: what the gateway and the Batch API may import of billing.

`BillingPort` (billing.client.port) is the request path's billing: hold, early hold, settle,
release, forget, implemented by billing.client.holds on a per-process group commit (group_commit,
pipe, unbooked). The rest are the few reads and synchronous asks the Batch API needs. An
import-linter contract in pyproject.toml keeps gateway and batches to this package.
"""

from billing.booking_asks import Charged
from billing.client import holds
from billing.client.group_commit import Booker, booker, start, stop
from billing.client.holds import (
    BudgetRoomMemo,
    EarlyHold,
    budget_room_memo,
    forget,
    hold,
    hold_early,
    release,
    release_leftover_holds,
    settle,
)
from billing.client.metrics import REGISTRY as metrics_registry
from billing.client.port import BillingPort, Hold, Spender
from billing.errors import BudgetExhausted, DatabaseUnavailable, RequestIdInUse, RequestIdUsed, UnknownModel
from billing.heartbeats import owners_released, process_owner
from billing.pricing import UnitPrices, charge_of, model_unit_prices, upper_bound_base_cost
from billing.selectors import hold_terms
from billing.services import charge_settle, hold_release

billing_port: BillingPort = holds  # the request path's billing (a module that implements the port)

__all__ = [
    "BillingPort",
    "Booker",
    "BudgetExhausted",
    "Charged",
    "DatabaseUnavailable",
    "EarlyHold",
    "Hold",
    "RequestIdInUse",
    "RequestIdUsed",
    "Spender",
    "BudgetRoomMemo",
    "UnitPrices",
    "UnknownModel",
    "booker",
    "charge_of",
    "charge_settle",
    "forget",
    "hold",
    "hold_early",
    "hold_release",
    "hold_terms",
    "metrics_registry",
    "model_unit_prices",
    "owners_released",
    "billing_port",
    "process_owner",
    "release",
    "release_leftover_holds",
    "budget_room_memo",
    "settle",
    "start",
    "stop",
    "upper_bound_base_cost",
]
