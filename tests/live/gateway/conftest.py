"""Live fixtures: one gateway with many small backends (one per scenario, by model name), and a
second, tight one for admission limits. Both are session-scoped: starting costs a few seconds."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from simbackend import RunningSim, SimConfig, start_in_thread
from tests.support.livestack import Gateway, free_port, start_gateway

# scenario -> simulator options (all run in threads of the test process)
SIMS = {
    "main": dict(slots=8, ttft_ms=5, tokens_per_s=2000),
    "slow": dict(slots=1, fixed_latency_ms=600),
    "r429": dict(slots=1, fixed_latency_ms=300),
    "fail": dict(slots=4, fail_rate=1.0),
    "vipmain": dict(slots=1, fixed_latency_ms=1200),
    "vipfb": dict(slots=2, ttft_ms=5, tokens_per_s=2000),
    "rpm": dict(slots=4, ttft_ms=5, tokens_per_s=2000),
    "tpm": dict(slots=4, ttft_ms=5, tokens_per_s=2000),
    "fair": dict(slots=1, ttft_ms=2, tokens_per_s=400),
    "tight": dict(slots=1, fixed_latency_ms=600),
    "fifo": dict(slots=1, fixed_latency_ms=600),
}

KEYS = {
    "alpha": ("alpha", "INTERACTIVE"),  # VIP
    "alpha_batch": ("alpha", "BATCH"),
    "beta": ("beta", "INTERACTIVE"),
    "beta_batch": ("beta", "BATCH"),
    "gamma": ("gamma", "BATCH"),  # may declare BATCH and RETRY only
    "heavy": ("heavy", "BATCH"),
    "light": ("light", "BATCH"),
    "blocker": ("blocker", "BATCH"),
    "revokable": ("beta", "INTERACTIVE"),
}

CLASSES = """
  classes:
    - {name: INTERACTIVE, level: 0, sla_ms: 3000,  price_factor: 1.6}
    - {name: NEAR_RT,     level: 1, sla_ms: 15000, price_factor: 1.2}
    - {name: BATCH,       level: 2, sla_ms: 60000, price_factor: 0.7}
    - {name: RETRY,       level: 3, sla_ms: 90000, price_factor: 0.4}
  aging:
    mode: piecewise
    segments:
      - {wait_ratio: "0-0.50",    boost: 0}
      - {wait_ratio: "0.50-0.80", boost: "linear",    k: 1.0}
      - {wait_ratio: "0.80-0.95", boost: "quadratic", k: 2.2}
      - {wait_ratio: ">=0.95",    boost: "preempt"}
  networks:
    BATCH_NET: [10.20.0.0/16]
  downgrade_check:
    - {name: long-prompt,   if: "class==INTERACTIVE and prompt_tokens>8000",     action: DOWNGRADE_TO_NEAR_RT}
    - {name: batch-network, if: "class==INTERACTIVE and src_cidr in BATCH_NET", action: DOWNGRADE_TO_BATCH}
  tenants:
    - {slug: alpha,   name: Alpha,   quota_share: 0.30, vip: true}
    - {slug: beta,    name: Beta,    quota_share: 0.20}
    - {slug: gamma,   name: Gamma,   quota_share: 0.10, classes: [BATCH, RETRY]}
    - {slug: heavy,   name: Heavy,   quota_share: 0.60}
    - {slug: light,   name: Light,   quota_share: 0.20}
    - {slug: blocker, name: Blocker, quota_share: 0.10}
"""


def _backend(name: str, url: str, model: str, slots: int, **extra) -> str:
    fields = {"name": name, "url": url, "models": f"[{model}]", "slots": slots, **extra}
    return "    - {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}\n"


def main_yaml(sims: dict[str, RunningSim]) -> str:
    url = {name: f"{sim.url}/v1" for name, sim in sims.items()}
    backends = "".join(
        [
            _backend("b-main", url["main"], "m-main", 8),
            _backend("b-slow", url["slow"], "m-slow", 1),
            _backend("b-429", url["r429"], "m-429", 3),
            _backend("b-fail", url["fail"], "m-fail", 4),
            _backend("b-down", f"http://127.0.0.1:{free_port()}/v1", "m-down", 2),
            _backend("b-off", url["main"], "m-off", 2, enabled="false"),
            _backend("b-vip", url["vipmain"], "m-vip", 1),
            _backend("b-vip-fallback", url["vipfb"], "m-vip", 2, fallback_for="b-vip"),
            _backend("b-rpm", url["rpm"], "m-rpm", 4, rpm=2),
            _backend("b-tpm", url["tpm"], "m-tpm", 4, tpm=150),
            _backend("b-fair", url["fair"], "m-fair", 1),
        ]
    )
    return (
        f"scheduler:\n  policy: fairgate\n{CLASSES}"
        "  tenant_fairness: {mode: weighted_fair_tokens, weight_source: quota_share, min_share: 0.02}\n"
        "  queue: {depth_cap: 20000, service_ms_prior: 100}\n"
        f"  backends:\n{backends}"
    )


@pytest.fixture(scope="session")
def sims() -> Iterator[dict[str, RunningSim]]:
    running: dict[str, RunningSim] = {}
    try:
        for name, options in SIMS.items():
            running[name] = start_in_thread(SimConfig(port=0, seed=7, **options))
        yield running
    finally:
        for sim in running.values():
            sim.stop()


@pytest.fixture(scope="session")
def gw(sims, tmp_path_factory) -> Iterator[Gateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw-main"),
        main_yaml(sims),
        KEYS,
        FAIRGATE_TRUSTED_PROXIES="127.0.0.1/32",
        FAIRGATE_CIRCUIT_FAILURES="3",
        FAIRGATE_CIRCUIT_COOLDOWN_MS="1500",
        FAIRGATE_UPSTREAM_RETRIES="1",
    )
    gateway.extra["sims"] = sims
    yield gateway
    gateway.stop()


def sim_stats(sim: RunningSim, **params: str) -> dict:
    return httpx.get(f"{sim.url}/stats", params=params).json()


TIGHT_YAML = f"""scheduler:
  policy: fairgate
{CLASSES}
  queue: {{depth_cap: 1, service_ms_prior: 100}}
  backends:
    - {{name: b-one, url: "{{url}}", models: [m-one], slots: 1}}
"""


@pytest.fixture(scope="session")
def tight(sims, tmp_path_factory) -> Iterator[Gateway]:
    """depth_cap 1 on a single-slot slow backend; no trusted proxies."""
    yaml_text = TIGHT_YAML.replace("{url}", f"{sims['tight'].url}/v1")
    gateway = start_gateway(tmp_path_factory.mktemp("gw-tight"), yaml_text, {"beta": ("beta", "INTERACTIVE")})
    yield gateway
    gateway.stop()


@pytest.fixture(scope="session")
def fifo(sims, tmp_path_factory) -> Iterator[Gateway]:
    """The field report's old gateway as a preset: one FIFO, no depth limit, cancellation ignored."""
    yaml_text = TIGHT_YAML.replace("policy: fairgate", "policy: fifo").replace("{url}", f"{sims['fifo'].url}/v1")
    gateway = start_gateway(tmp_path_factory.mktemp("gw-fifo"), yaml_text, {"beta": ("beta", "INTERACTIVE")})
    gateway.extra["sim"] = sims["fifo"]
    yield gateway
    gateway.stop()
