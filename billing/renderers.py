"""CSV export of report rows: `?format=csv` or `Accept: text/csv` on any report endpoint."""

from __future__ import annotations

import csv
import io

from rest_framework.renderers import BaseRenderer


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
            writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
        view = (renderer_context or {}).get("view")
        response = (renderer_context or {}).get("response")
        if response is not None and view is not None and response.status_code == 200:
            response["Content-Disposition"] = f'attachment; filename="{getattr(view, "csv_name", "report")}.csv"'
        return buffer.getvalue().encode(self.charset)
