"""House rules not yet enforced: long module docstrings, and code comments that quote measurements.

    .venv/bin/python scripts/house_check.py [--check]

Lists, in the product's modules (the apps, `config`, `sim`; not migrations, tests or static files),
module docstrings over MAX_DOCSTRING_LINES lines and `#` comments with a number and a unit of
measure (ms, µs, s, %, x, req/s, MB ...), which belong in bench/REPORT*.md. Prints counts and the
list; with `--check` the exit status is 1 when anything is found.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path

PRODUCT = ("tenants", "scheduling", "billing", "gateway", "batches", "console", "config", "sim")
NOT_PRODUCT_PARTS = frozenset({"migrations", "tests", "static"})
MAX_DOCSTRING_LINES = 10
# A number followed by a unit of time, rate, share, ratio or size: "3.2 ms", "40 %", "1.5x", "2,000 req/s".
# A bare "s" needs a space before it ("30 s", not "429s").
MEASURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
    r"(?:\s?(?:ms|µs|us|ns|%|x|×|req/s|requests/s|/s|rps|[KMG]i?B)|\s(?:s|sec|seconds?|minutes?|cores?))"
    r"(?![\w/])"
)


def product_files(root: Path, packages: Iterable[str] = PRODUCT) -> list[Path]:
    files = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if not NOT_PRODUCT_PARTS.intersection(path.relative_to(root).parts):
                files.append(path)
    return files


def docstring_lines(source: str) -> int:
    """How many lines the module's docstring has (0 without one)."""
    docstring = ast.get_docstring(ast.parse(source), clean=True)
    return len(docstring.splitlines()) if docstring else 0


def measured_comments(source: str) -> list[tuple[int, str]]:
    """The `#` comments that quote a number with a unit, as (line, comment)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and MEASURE.search(token.string):
            found.append((token.start[0], token.string.strip()))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when anything is found")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    long_docstrings = []
    comments = []
    for path in product_files(root):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(root).as_posix()
        lines = docstring_lines(source)
        if lines > MAX_DOCSTRING_LINES:
            long_docstrings.append((name, lines))
        comments.extend((name, line, text) for line, text in measured_comments(source))
    print(f"module docstrings over {MAX_DOCSTRING_LINES} lines: {len(long_docstrings)}")
    for name, lines in sorted(long_docstrings, key=lambda item: (-item[1], item[0])):
        print(f"  {name}: {lines}")
    print(f"comments quoting a measured figure: {len(comments)}")
    for name, line, text in comments:
        print(f"  {name}:{line}: {text}")
    return 1 if args.check and (long_docstrings or comments) else 0


if __name__ == "__main__":
    sys.exit(main())
