"""Every query of the Grafana dashboard (docs/grafana/fairgate.json) names only series that
/metrics exports, and uses only PromQL words this check knows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import batches.metrics  # noqa: F401  (its series, in the gateway's registries)
import gateway.runtime  # noqa: F401  (the scheduler's collector)
from gateway.metrics import exported_names

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "fairgate.json"
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "by", "without",
    "on", "ignoring", "and", "or", "unless", "topk", "bottomk", "clamp_min", "delta", "deriv",
}  # fmt: skip
NEEDED = {  # what the dashboard must show, by a series each uses
    "queue depth": "fairgate_queue_depth",
    "queue wait": "fairgate_queue_wait_seconds_bucket",
    "time to first token": "fairgate_time_to_first_token_seconds_bucket",
    "spend": "fairgate_spend_total",
    "rejects": "fairgate_rejects_total",
    "backend slots in use": "fairgate_backend_slots_in_use",
}


def _exprs(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]


def _names(expr: str) -> tuple[set[str], set[str]]:
    """(series named, other words) of one PromQL expression."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # ranges
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", r"\1", bare)  # grouping labels
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    series = {w for w in words if w not in PROMQL_WORDS}
    return series, words - series


def test_every_query_names_exported_series_only():
    exported = exported_names()
    exprs = _exprs(json.loads(DASHBOARD.read_text()))
    assert exprs
    used: set[str] = set()
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        series, _ = _names(expr)
        assert series, f"no series in {expr!r}"
        assert series <= exported, f"{expr!r} names {sorted(series - exported)}, not exported"
        used |= series
    missing = {what: name for what, name in NEEDED.items() if name not in used}
    assert not missing, f"the dashboard does not show {missing}"


def test_the_check_catches_a_name_not_exported():
    series, _ = _names('sum by (tenant) (rate(fairgate_spend_totals{cls="A"}[5m])) * 3600')
    assert series == {"fairgate_spend_totals"} and not series <= exported_names()
