"""Budget-alert webhooks: the body in the endpoint's format (Fairgate JSON, a Slack message, a Teams
Adaptive Card), signed with the endpoint's secret (docs/billing-and-console.md, "Budget alerts")."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time

SIGNATURE_HEADER = "X-Fairgate-Signature"
TIMESTAMP_HEADER = "X-Fairgate-Timestamp"


def secret_new() -> str:
    return secrets.token_hex(32)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=`` and the hex HMAC-SHA256, keyed by ``secret``, of ``timestamp``, a dot and the body."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def signature_valid(secret: str, timestamp: str, body: bytes, given: str) -> bool:
    return hmac.compare_digest(signature(secret, timestamp, body), given)


def headline(payload: dict) -> str:
    if payload["type"] == "budget.forecast":
        return (
            f"Budget {payload['budget']} of {payload['tenant']} runs out on {payload['runs_out_on']} at the current "
            f"burn, before its period ends: {payload['spent']} of {payload['limit']} {payload['currency']} spent."
        )
    return (
        f"Budget {payload['budget']} of {payload['tenant']} crossed {payload['threshold_pct']} %: "
        f"{payload['spent']} of {payload['limit']} {payload['currency']} spent."
    )


def _facts(payload: dict) -> list[tuple[str, str]]:
    return [
        ("Tenant", payload["tenant"]),
        ("Budget", payload["budget"]),
        ("Spent", f"{payload['spent']} {payload['currency']}"),
        ("Limit", f"{payload['limit']} {payload['currency']}"),
        ("Period", f"{payload['period']['starts_at'][:10]} to {payload['period']['ends_at'][:10]}"),
    ]


def body_of(payload: dict, webhook_format: str) -> dict:
    """The JSON body an endpoint of ``webhook_format`` (json, slack, teams) understands."""
    if webhook_format == "slack":
        facts = "\n".join(f"*{name}:* {value}" for name, value in _facts(payload))
        return {
            "text": headline(payload),
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": f"*{headline(payload)}*"}},
                {"type": "section", "text": {"type": "mrkdwn", "text": facts}},
            ],
        }
    if webhook_format == "teams":
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard",
            "version": "1.4",
            "body": [
                {"type": "TextBlock", "text": headline(payload), "weight": "Bolder", "size": "Medium", "wrap": True},
                {"type": "FactSet", "facts": [{"title": n, "value": v} for n, v in _facts(payload)]},
            ],
        }
        return {
            "type": "message",
            "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "content": card}],
        }
    return payload


def request_of(payload: dict, webhook_format: str, secret: str, *, now_s: float | None = None) -> tuple[bytes, dict]:
    """The body bytes and headers of one delivery, signed."""
    body = json.dumps(body_of(payload, webhook_format), separators=(",", ":"), sort_keys=True).encode()
    timestamp = str(int(time.time() if now_s is None else now_s))
    headers = {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(secret, timestamp, body),
    }
    return body, headers
