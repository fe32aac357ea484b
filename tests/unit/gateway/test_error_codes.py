"""The error codes in code are the README's error table: every row names a code of
gateway.errors.ErrorCode with its status, and every code a client can get has a status."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.errors import STATUS, ErrorCode

README = Path(__file__).resolve().parents[3] / "README.md"
ROW = re.compile(r"^\| (\d{3}) \| `([a-z_]+)` \|", re.MULTILINE)


def test_every_code_has_a_status():
    assert set(STATUS) == set(ErrorCode)


def test_the_readme_error_table_names_codes_with_their_status():
    rows = ROW.findall(README.read_text())
    assert len(rows) >= 10  # the table is there
    for status, code in rows:
        assert code in set(ErrorCode), f"README names {code!r}, which gateway.errors.ErrorCode lacks"
        assert STATUS[ErrorCode(code)] == int(status), f"README gives {code} status {status}"
