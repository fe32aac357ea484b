"""README.md and docs/*.md name only files and modules that exist, and README stays short."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

# What a repository path starts with, or how it ends; anything else with a "/" (an API path, "requests/s")
# is not taken for one.
TOP_LEVEL = ("batches", "bench", "billing", "config", "console", "docs", "gateway", "scheduling", "scripts")
TOP_LEVEL += ("sim", "simbackend", "tenants", "tests", ".ci")
EXTENSIONS = (".py", ".md", ".json", ".yaml", ".yml", ".toml", ".txt", ".html", ".js", ".css", ".cfg", ".lock")
# Made at run time or by the wheel's build, not kept in the repository; and a reader's own file.
GENERATED = ("var/", "artifacts/", "dist/", "node_modules/", ".venv/", "console/static/console-vendor/")
NOT_IN_REPOSITORY = {"my-scheduler.yaml", "scheduler.yaml", "my-signin.yaml"}
PACKAGES = ("batches", "bench", "billing", "config", "console", "gateway", "scheduling", "sim", "simbackend", "tenants")

CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
TOKEN = re.compile(r"[\w.*/-]+")
DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def path_like(token: str) -> bool:
    if token.startswith(("/", "../", "http")) or token.startswith(GENERATED) or "*" in token:
        return False
    if token.endswith(EXTENSIONS) and "." in token.rsplit("/", 1)[-1][1:]:
        return "/" in token or token.count(".") == 1
    return "/" in token and token.split("/")[0] in TOP_LEVEL


def named_paths(text: str) -> set[str]:
    """Repository paths in code spans and fenced blocks (taken from the repository's root)."""
    spans = [m.group(1) for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    spans += [m.group(0) for m in FENCE.finditer(text)]
    tokens = {t.rstrip(".,:;") for span in spans for t in TOKEN.findall(span)}
    return {t for t in tokens if path_like(t)}


def linked_paths(text: str) -> set[str]:
    """Link targets that are files of the repository (taken from the document's folder)."""
    targets = {m.group(1).split("#")[0] for m in LINK.finditer(text)}
    return {t for t in targets if t and not t.startswith(("http", "mailto:", "#"))}


def named_modules(text: str) -> set[str]:
    """Dotted names in code spans that start with one of the project's packages (`gateway.tarpit`)."""
    spans = [m.group(1) for m in CODE_SPAN.finditer(FENCE.sub("", text))] + FENCE.findall(text)
    names = {t.rstrip(".") for span in spans for t in TOKEN.findall(span)}
    return {n for n in names if DOTTED.match(n) and n.split(".")[0] in PACKAGES and not n.endswith(EXTENSIONS)}


def module_exists(name: str) -> bool:
    """A module, or a name in a module, or a string the code spells (a Celery task, a check id)."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:end])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return end >= len(parts) - 1
    return any(name in path.read_text(encoding="utf-8") for path in (ROOT / parts[0]).rglob("*.py"))


def file_names() -> set[str]:
    names = set()
    for _folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in {".git", "node_modules", ".venv", "var"}]
        names.update(files)
    return names


FILE_NAMES = file_names()


def exists(path: str, document: Path) -> bool:
    """From the repository's root or the document's folder; a bare file name (`admission.py`, named
    beside its folder) anywhere in the repository."""
    if "/" not in path:
        return path in FILE_NAMES or path in NOT_IN_REPOSITORY
    return any((base / path.rstrip("/")).exists() for base in (ROOT, document.parent))


@pytest.mark.parametrize("document", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_files_exist(document: Path) -> None:
    text = document.read_text(encoding="utf-8")

    missing = sorted(p for p in named_paths(text) if not exists(p, document))
    missing += sorted(p for p in linked_paths(text) if not (document.parent / p).exists())
    missing += sorted(m for m in named_modules(text) if not module_exists(m))

    assert missing == []


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())

    assert lines <= README_MAX_LINES
