"""The upstream-client comparison runs and reports every client (bench.upstream_clients)."""

from __future__ import annotations

import pytest

from bench import upstream_clients

pytestmark = pytest.mark.live


def test_the_client_comparison_measures_each_client_on_the_same_backend(capsys):
    assert upstream_clients.main(["--requests", "40", "--concurrency", "4", "--rounds", "1"]) == 0
    table = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ") and "ms" in line}
    assert set(rows) == {"fairgate", "httpx", "aiohttp"}
    assert all(line.rstrip(" |").endswith("| 0") for line in rows.values())  # none failed
