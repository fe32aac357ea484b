"""What billing publishes once a booking has committed (events.publish_on_commit): each charge
appended and each budget alert raised, as plain data in the shape the console shows them.
"""

from __future__ import annotations

from typing import Any

from billing.incentives import factor_text

CHARGE = "charge"
ALERT = "alert"


def charge_news(entry) -> dict[str, Any]:
    """A charge ledger entry (a LedgerEntry or a booking's Booked) as plain data."""
    return {
        "request_id": entry.request_id,
        "class": entry.class_name,
        "model": entry.model,
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "factor": factor_text(entry.factor),
        "amount": str(entry.amount),
        "at": entry.at.isoformat(),
    }


def alert_news(alert) -> dict[str, Any]:
    """A BudgetAlert (its budget loaded) as plain data."""
    return {
        "budget": alert.budget.label,
        "threshold_pct": alert.threshold_pct,
        "runs_out_on": alert.runs_out_on.isoformat() if alert.runs_out_on else None,
        "spent": str(alert.spent),
        "limit": str(alert.limit),
        "at": alert.created_at.isoformat(),
    }
