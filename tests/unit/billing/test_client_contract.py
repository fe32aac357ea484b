"""The import-linter contract that keeps the gateway and batches to billing.client lists billing's
other modules one by one (import-linter has no "all but one"): a new module must be listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_billing_module_but_its_client_is_forbidden_to_the_gateway_and_batches():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if "billing.client" in c["name"]]
    billing = ROOT / "billing"
    modules = {
        f"billing.{path.stem}"
        for path in billing.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert set(contract["forbidden_modules"]) == modules - {"billing.client"}
