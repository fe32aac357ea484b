"""Small scenarios written to tmp_path (the shipped ones are too big for unit tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CONFIG = {
    "classes": [
        {"name": "INTERACTIVE", "level": 0, "sla_ms": 3000, "price_factor": "1.6"},
        {"name": "NEAR_RT", "level": 1, "sla_ms": 15000, "price_factor": "1.2"},
        {"name": "BATCH", "level": 2, "sla_ms": 1800000, "price_factor": "0.7"},
        {"name": "RETRY", "level": 3, "sla_ms": 3600000, "price_factor": "0.4"},
    ],
    "aging": {
        "mode": "piecewise",
        "segments": [
            {"wait_ratio": "0-0.50", "boost": 0},
            {"wait_ratio": "0.50-0.80", "boost": "linear", "k": 1.0},
            {"wait_ratio": "0.80-0.95", "boost": "quadratic", "k": 2.2},
            {"wait_ratio": ">=0.95", "boost": "preempt"},
        ],
    },
    "tenant_fairness": {"mode": "weighted_fair_tokens", "weight_source": "quota_share", "min_share": 0.02},
    "queue": {"depth_cap": 20000},
    "networks": {"BATCH_NET": ["10.20.0.0/16"]},
    "downgrade_check": [
        {"name": "long-prompt", "if": "class==INTERACTIVE and prompt_tokens>8000", "action": "DOWNGRADE_TO_NEAR_RT"},
        {"name": "batch-network", "if": "class==INTERACTIVE and src_cidr in BATCH_NET", "action": "DOWNGRADE_TO_BATCH"},
    ],
}


def tiny_surge() -> dict:
    chat = {"prompt_tokens": [200, 2000], "output_tokens": [50, 200], "service_ms": [1000, 3000]}
    return {
        "name": "tiny-surge",
        "seed": 7,
        "timeline_step_ms": 60_000,
        "jain_window_ms": 60_000,
        "config": CONFIG,
        "backends": [{"name": "gpu", "models": ["m"], "slots": 8}],
        "tenants": [
            {"slug": "a", "quota_share": 0.3},
            {"slug": "b", "quota_share": 0.3},
            {"slug": "small", "quota_share": 0.02},
            {"slug": "fin", "quota_share": 0.1},
            {"slug": "rnd", "quota_share": 0.1},
        ],
        "generators": [
            {
                "kind": "poisson",
                "tenant": ["a", "b", "small"],
                "class": "INTERACTIVE",
                "rate_per_s": 0.3,
                "end_ms": 600_000,
                "patience_ms": [5000, 20000],
                **chat,
            },
            {
                "kind": "poisson",
                "tenant": "a",
                "class": "INTERACTIVE",
                "rate_per_s": 0.02,
                "end_ms": 600_000,
                "src_ip": "10.20.1.1",
                **chat,
            },
            {
                "kind": "burst",
                "tenant": "fin",
                "class": "BATCH",
                "count": 300,
                "at_ms": 60_000,
                "spread_ms": 5000,
                "service_ms": [8000, 12000],
                "output_tokens": [100, 300],
            },
            {
                "kind": "burst",
                "tenant": "rnd",
                "class": "BATCH",
                "count": 100,
                "at_ms": 90_000,
                "spread_ms": 5000,
                "service_ms": [8000, 12000],
                "output_tokens": [100, 300],
            },
        ],
    }


def write(tmp_path: Path, doc: dict, name: str = "scenario.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def surge_path(tmp_path: Path) -> Path:
    return write(tmp_path, tiny_surge())
