"""``csv_cell``: text a spreadsheet would run as a formula is neutralised, numbers stay numbers."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest

from billing.renderers import csv_cell


@pytest.mark.parametrize(
    "text",
    ['=HYPERLINK("x")', "=1+2", "+1+2", "-x", "-1+2", "@SUM(A1)", "\tx", "\r=1", "-", "=", "+1", "-1e5x"],
)
def test_text_that_starts_a_formula_gets_a_quote(text):
    assert csv_cell(text) == "'" + text


@pytest.mark.parametrize("text", ["req-1", "a=b", "sim-llama", "", "1+2", "x@y", "'=already"])
def test_other_text_is_left_as_it_is(text):
    assert csv_cell(text) == text


@pytest.mark.parametrize("value", [0, -3, Decimal("-1.50"), Decimal("2.000001"), -0.5])
def test_numbers_stay_numbers(value):
    assert csv_cell(value) == value


@pytest.mark.parametrize("text", ["-1.50", "-0.333333", "12", "-7", "-1E+3", "3.2"])
def test_decimal_strings_of_amounts_stay_plain(text):
    """The reports give amounts as exact decimal strings; a negative one is a number, not a formula."""
    assert csv_cell(text) == text


def test_none_is_empty_and_nul_is_replaced():
    assert csv_cell(None) == ""
    assert csv_cell("a\x00b") == "a\ufffdb"


def test_newlines_and_quotes_in_a_cell_survive_a_round_trip():
    from billing.renderers import CSVRenderer

    cells = ["a\nb", "c\rd", 'e"f,g', "h\r\ni", "=x\ny"]
    body = CSVRenderer().render({"rows": [{f"c{i}": v for i, v in enumerate(cells)}]}).decode()
    rows = list(csv.reader(io.StringIO(body, newline="")))
    assert rows[1] == cells[:4] + ["'=x\ny"]
