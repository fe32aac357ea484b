"""Billing's exceptions. The gateway maps them to client errors (402 budget_exhausted, ...)."""

from __future__ import annotations

from decimal import Decimal


class BillingError(Exception):
    """Base of billing's refusals."""


class BudgetExhausted(BillingError):
    """The remaining budget cannot cover the hold a request needs (402 budget_exhausted)."""

    def __init__(self, budget_label: str, remaining: Decimal, needed: Decimal, currency: str = ""):
        self.budget_label = budget_label
        self.remaining = remaining
        self.needed = needed
        self.currency = currency
        unit = f" {currency}" if currency else ""
        super().__init__(
            f"Budget {budget_label} has {remaining}{unit} remaining; this request needs a hold of {needed}{unit}."
        )

    def __reduce__(self):  # crosses from the billing worker process to the gateway
        return type(self), (self.budget_label, self.remaining, self.needed, self.currency)


class UnknownTenant(BillingError, LookupError):
    pass


class UnknownClass(BillingError, LookupError):
    """No such class, or it has no price version in force."""


class UnknownModel(BillingError, LookupError):
    """No enabled backend serves the requested model."""


class UnknownBackend(BillingError, LookupError):
    pass


class HoldNotFound(BillingError, LookupError):
    """Settlement of a request that was never held."""


class RequestIdUsed(BillingError):
    """A hold for a request id whose earlier request was served (charged), or that was sent too
    many times: an id whose request ended unserved may be sent again."""


class RequestIdInUse(BillingError):
    """A hold for a request id whose earlier request is still live in another gateway process."""


class DatabaseUnavailable(BillingError):
    """The database could not be reached (an OperationalError or InterfaceError): the ask may be
    sent again, booking is idempotent per request id. The gateway answers 503 service_unavailable."""


def transient(error: BaseException) -> bool:
    """A booking failure that may not recur (the database out, the billing worker gone), so the ask
    is kept and sent again; any other billing error is final."""
    return isinstance(error, DatabaseUnavailable) or not isinstance(error, BillingError)
