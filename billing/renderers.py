"""CSV export of report rows: `?format=csv` or `Accept: text/csv` on any report endpoint.

Every cell goes through ``csv_cell``: text that a spreadsheet would run as a formula gets a
leading ``'``; numbers (and the exact decimal strings the reports give for amounts) stay numbers.
"""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal

from rest_framework.renderers import BaseRenderer

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
NUMBER_RE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")  # what str() of an int or a Decimal writes


def csv_cell(value: object) -> object:
    """One cell as a spreadsheet may open it safely: None is empty, numbers stay numbers, text
    starting with a formula character is prefixed with ``'``, and NUL (which readers choke on)
    becomes U+FFFD. Newlines need no help: the writer quotes them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float | Decimal):
        return value
    text = str(value).replace("\x00", "\ufffd")
    if text.startswith(FORMULA_STARTS) and not NUMBER_RE.fullmatch(text):
        return "'" + text
    return text


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        rows = data.get("rows") if isinstance(data, dict) and "rows" in data else data
        if isinstance(data, dict) and "rows" not in data:
            rows = [data]  # an error body, or a single record
        buffer = io.StringIO()
        if rows:
            columns = list(rows[0].keys())
            # "\r\n" ends a record (RFC 4180), so a lone "\r" or "\n" inside a cell is quoted too
            writer = csv.writer(buffer, lineterminator="\r\n")
            writer.writerow([csv_cell(c) for c in columns])
            writer.writerows([csv_cell(row.get(c)) for c in columns] for row in rows)
        view = (renderer_context or {}).get("view")
        response = (renderer_context or {}).get("response")
        if response is not None and view is not None and response.status_code == 200:
            response["Content-Disposition"] = f'attachment; filename="{getattr(view, "csv_name", "report")}.csv"'
        return buffer.getvalue().encode(self.charset)
