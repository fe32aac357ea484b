"""The report API's CSV neutralises formulas in text cells (request ids, labels, reasons) that a
client or an operator chose, and leaves amounts as plain numbers."""

from __future__ import annotations

import csv
import io
from decimal import Decimal as D

import pytest

from billing.services import ledger_adjust
from tests.integration.billing.helpers import hold, settle

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.billing.urls")]

# X-Request-Id allows letters, digits and . _ : @ + = ~ - so the last four a client can send as they are
HOSTILE_IDS = ['=HYPERLINK("x")', "=1+2", "@SUM", "-x", "+cmd"]


def csv_rows(client, url: str, **params) -> list[dict[str, str]]:
    response = client.get(url, {"format": "csv", **params})
    assert response.status_code == 200, response.content
    return list(csv.DictReader(io.StringIO(response.content.decode(), newline="")))


def test_ledger_csv_neutralises_formulas_and_keeps_amounts(world, finance):
    for request_id in HOSTILE_IDS:
        hold(request_id)
        settle(request_id)
    ledger_adjust(tenant_slug="alpha", amount=D("-1.50"), reason="=cmd|' /C calc'!A0", author="@fay")

    rows = csv_rows(finance, "/api/billing/ledger/", limit="1000")
    charges = {r["request_id"]: r for r in rows if r["kind"] == "charge"}
    assert set(charges) == {"'" + rid for rid in HOSTILE_IDS}
    assert charges['\'=HYPERLINK("x")']["amount"] == "1.120000"  # 0.7 base x 1.6, a plain number
    (credit,) = [r for r in rows if r["kind"] == "adjustment"]
    assert credit["amount"] == "-1.500000"  # a negative amount is a number, not text to neutralise
    assert credit["reason"] == "'=cmd|' /C calc'!A0" and credit["author"] == "'@fay"
    for row in rows:
        for column, cell in row.items():
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), (column, cell)
            if cell.startswith("-"):
                D(cell)  # only numbers may start with "-"
