"""The imports between Fairgate's top-level packages, and the cycles among them.

    .venv/bin/python scripts/import_graph.py      (or: make import-graph)

One line per edge ("a -> b": some module of a imports one of b), built with grimp (import-linter's
graph), then the pairs that import each other.
"""

from __future__ import annotations

import importlib.util

import grimp

PACKAGES = ("tenants", "gateway", "billing", "console", "scheduling", "config", "bench", "sim", "simbackend")


def edges(packages: tuple[str, ...]) -> set[tuple[str, str]]:
    graph = grimp.build_graph(*packages)
    found = set()
    for module in graph.modules:
        source = module.split(".")[0]
        for imported in graph.find_modules_directly_imported_by(module):
            target = imported.split(".")[0]
            if source != target and target in packages:
                found.add((source, target))
    return found


def main() -> None:
    packages = tuple(p for p in PACKAGES if importlib.util.find_spec(p) is not None)
    found = edges(packages)
    for source, target in sorted(found):
        print(f"{source} -> {target}")
    cycles = sorted({tuple(sorted(pair)) for pair in found if pair[::-1] in found})
    print("cycles:", ", ".join(f"{a} <-> {b}" for a, b in cycles) or "none")


if __name__ == "__main__":
    main()
