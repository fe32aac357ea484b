"""The imports between Fairgate's packages, the import circles among the product's modules, and its
long modules.

    .venv/bin/python scripts/import_graph.py [--check]      (or: make import-graph)

Prints one line per edge between top-level packages ("a -> b": some module of a imports one of b),
then every circle among the product's modules (imports inside functions count; imports under
`if TYPE_CHECKING:` do not), then the product modules over MAX_LINES lines. The product is the apps,
`config` and the simulator (`sim`), without migrations, tests or static files. With `--check` the
exit status is 1 when a circle or a long module is found. The graph is grimp's (import-linter's).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

import grimp

PACKAGES = (
    "audit",
    "events",
    "tenants",
    "gateway",
    "billing",
    "batches",
    "console",
    "scheduling",
    "config",
    "sim",
    "bench",
    "simbackend",
)
PRODUCT = ("audit", "events", "tenants", "scheduling", "billing", "gateway", "batches", "console", "config", "sim")
NOT_PRODUCT_PARTS = frozenset({"migrations", "tests", "static"})
MAX_LINES = 450


def present(packages: Iterable[str]) -> tuple[str, ...]:
    return tuple(p for p in packages if importlib.util.find_spec(p) is not None)


def is_product_module(module: str) -> bool:
    return not NOT_PRODUCT_PARTS.intersection(module.split("."))


def package_edges(graph: grimp.ImportGraph, packages: tuple[str, ...]) -> set[tuple[str, str]]:
    found = set()
    for module in graph.modules:
        source = module.split(".")[0]
        for imported in graph.find_modules_directly_imported_by(module):
            target = imported.split(".")[0]
            if source != target and target in packages:
                found.add((source, target))
    return found


def module_imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Each product module and the product modules it imports directly."""
    modules = {m for m in graph.modules if is_product_module(m)}
    return {m: {t for t in graph.find_modules_directly_imported_by(m) if t in modules and t != m} for m in modules}


def circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of more than one module that import each other round a circle (strongly connected
    components, Tarjan's algorithm without recursion), each sorted, smallest group first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    counter = 0
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(imports[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
    return sorted((sorted(group) for group in groups), key=lambda group: (len(group), group))


def closed_path(group: set[str], imports: dict[str, set[str]]) -> list[str]:
    """The shortest import path from the group's first module back to itself, within the group."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(imports[node] & group):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no closed path in {sorted(group)}")


def long_modules(root: Path, packages: Iterable[str], max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    """Product files over max_lines lines, as (path relative to root, lines), longest first."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if NOT_PRODUCT_PARTS.intersection(relative.parts):
                continue
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > max_lines:
                found.append((relative.as_posix(), lines))
    return sorted(found, key=lambda item: (-item[1], item[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only the product's checks; exit 1 on a circle or a long module"
    )
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    if not args.check:
        packages = present(PACKAGES)
        graph = grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)
        for source, target in sorted(package_edges(graph, packages)):
            print(f"{source} -> {target}")
        pairs = package_edges(graph, packages)
        cycles = sorted({tuple(sorted(pair)) for pair in pairs if pair[::-1] in pairs})
        print("package cycles:", ", ".join(f"{a} <-> {b}" for a, b in cycles) or "none")

    product = present(PRODUCT)
    product_graph = grimp.build_graph(*product, exclude_type_checking_imports=True, cache_dir=None)
    found_circles = circles(module_imports(product_graph))
    print(f"module circles in the product: {len(found_circles)}")
    imports = module_imports(product_graph)
    for group in found_circles:
        print(f"  {len(group)} modules, e.g. " + " -> ".join(closed_path(set(group), imports)))
        print("    " + ", ".join(group))
    found_long = long_modules(root, product)
    print(f"product modules over {MAX_LINES} lines: {len(found_long)}")
    for name, lines in found_long:
        print(f"  {name}: {lines}")
    return 1 if args.check and (found_circles or found_long) else 0


if __name__ == "__main__":
    sys.exit(main())
