"""scripts/import_graph.py and scripts/house_check.py on tiny fake package trees."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import grimp
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fairgate_script_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


import_graph = load_script("import_graph")
house_check = load_script("house_check")


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def fake_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write_tree(
        tmp_path,
        {
            "fgfake_app/__init__.py": "",
            # a -> b -> c -> a: a circle, one of its imports inside a function
            "fgfake_app/a.py": "from fgfake_app import b\n",
            "fgfake_app/b.py": "def later():\n    from fgfake_app import c\n",
            "fgfake_app/c.py": "import fgfake_app.a\n",
            # d <-> e only under TYPE_CHECKING: not a circle
            "fgfake_app/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fgfake_app import e\n",
            "fgfake_app/e.py": "from fgfake_app import d\n",
            # a circle through migrations is not the product's
            "fgfake_app/migrations/__init__.py": "",
            "fgfake_app/migrations/m1.py": "from fgfake_app import f\n",
            "fgfake_app/f.py": "from fgfake_app.migrations import m1\n",
            "fgfake_app/long.py": "x = 1\n" * 451,
            "fgfake_app/exact.py": "x = 1\n" * 450,
            "fgfake_app/tests/test_long.py": "x = 1\n" * 500,
            "fgfake_other/__init__.py": "",
            "fgfake_other/g.py": "from fgfake_app import a\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_circles_are_found_with_function_imports_and_without_type_checking_ones(fake_tree: Path) -> None:
    graph = grimp.build_graph("fgfake_app", "fgfake_other", exclude_type_checking_imports=True, cache_dir=None)
    imports = import_graph.module_imports(graph)

    assert "fgfake_app.migrations.m1" not in imports
    assert import_graph.circles(imports) == [["fgfake_app.a", "fgfake_app.b", "fgfake_app.c"]]
    path = import_graph.closed_path({"fgfake_app.a", "fgfake_app.b", "fgfake_app.c"}, imports)
    assert path == ["fgfake_app.a", "fgfake_app.b", "fgfake_app.c", "fgfake_app.a"]
    assert import_graph.package_edges(graph, ("fgfake_app", "fgfake_other")) == {("fgfake_other", "fgfake_app")}


def test_circles_on_a_plain_mapping() -> None:
    imports = {"p.x": {"p.y"}, "p.y": {"p.x", "p.z"}, "p.z": set(), "q.u": {"q.v"}, "q.v": {"q.w"}, "q.w": {"q.u"}}

    assert import_graph.circles(imports) == [["p.x", "p.y"], ["q.u", "q.v", "q.w"]]
    assert import_graph.circles({"p.x": {"p.y"}, "p.y": set()}) == []


def test_long_modules_skip_tests_and_migrations(fake_tree: Path) -> None:
    assert import_graph.long_modules(fake_tree, ["fgfake_app", "fgfake_other"]) == [("fgfake_app/long.py", 451)]


def test_docstring_lines() -> None:
    eleven = '"""' + "\n".join(f"line {n}" for n in range(11)) + '"""\nx = 1\n'

    assert house_check.docstring_lines(eleven) == 11
    assert house_check.docstring_lines('"""One line."""\n') == 1
    assert house_check.docstring_lines("x = 1\n") == 0


@pytest.mark.parametrize(
    "comment",
    ["# took 3.2 ms", "# about 8 % of the CPU", "# 1.5x faster", "# 2,000 req/s", "# ~3 MB a file", "# in 30 s"],
)
def test_measured_comments_are_found(comment: str) -> None:
    assert house_check.measured_comments(f"x = 1  {comment}\n") == [(1, comment)]


@pytest.mark.parametrize(
    "source",
    ["# Upstream 429s a request may absorb\n", "# redis-py 8 and HTTP/1.1\n", 'x = "30 ms"\n', "y = 2  # v2 api\n"],
)
def test_other_comments_and_strings_are_not(source: str) -> None:
    assert house_check.measured_comments(source) == []


def test_product_files_skip_tests_and_migrations(fake_tree: Path) -> None:
    names = [p.relative_to(fake_tree).as_posix() for p in house_check.product_files(fake_tree, ["fgfake_app"])]

    assert "fgfake_app/a.py" in names
    assert not [n for n in names if "/tests/" in n or "/migrations/" in n]
