"""Budget-alert webhook bodies and their signature (billing.webhooks)."""

from __future__ import annotations

import json

from billing.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, request_of, signature, signature_valid

PAYLOAD = {
    "type": "budget.threshold_crossed",
    "tenant": "sales",
    "budget": "FY2026",
    "period": {"kind": "year", "starts_at": "2026-01-01T00:00:00+00:00", "ends_at": "2027-01-01T00:00:00+00:00"},
    "threshold_pct": 80,
    "spent": "800.00",
    "limit": "1000.00",
    "currency": "EUR",
    "at": "2026-12-07T10:00:00+00:00",
}


def test_the_signature_covers_the_timestamp_and_the_body():
    body, headers = request_of(PAYLOAD, "json", "s3cret", now_s=1_790_000_000)
    assert headers[TIMESTAMP_HEADER] == "1790000000"
    assert signature_valid("s3cret", "1790000000", body, headers[SIGNATURE_HEADER])
    assert not signature_valid("other", "1790000000", body, headers[SIGNATURE_HEADER])
    assert not signature_valid("s3cret", "1790000001", body, headers[SIGNATURE_HEADER])
    assert not signature_valid("s3cret", "1790000000", body + b" ", headers[SIGNATURE_HEADER])
    assert headers[SIGNATURE_HEADER] == signature("s3cret", "1790000000", body)
    assert headers[SIGNATURE_HEADER].startswith("v1=") and len(headers[SIGNATURE_HEADER]) == 3 + 64
    assert json.loads(body) == PAYLOAD  # Fairgate's own format is the payload itself


def test_slack_gets_a_message_with_text_and_blocks():
    body, _ = request_of(PAYLOAD, "slack", "k")
    message = json.loads(body)
    assert message["text"] == "Budget FY2026 of sales crossed 80 %: 800.00 of 1000.00 EUR spent."
    assert [b["type"] for b in message["blocks"]] == ["section", "section"]
    assert "*Limit:* 1000.00 EUR" in message["blocks"][1]["text"]["text"]


def test_teams_gets_an_adaptive_card():
    body, _ = request_of(PAYLOAD, "teams", "k")
    message = json.loads(body)
    assert message["type"] == "message"
    attachment = message["attachments"][0]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    assert card["body"][0]["text"].startswith("Budget FY2026 of sales crossed 80 %")
    assert {"title": "Spent", "value": "800.00 EUR"} in card["body"][1]["facts"]
