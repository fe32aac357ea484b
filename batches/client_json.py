"""JSON that batches store in PostgreSQL (text and jsonb columns), checked or made storable.

PostgreSQL refuses the character U+0000 in text and jsonb and NaN and Infinity in jsonb; Python's
json module accepts them (and 1e400 as Infinity), and nesting up to the interpreter's recursion
limit. A client's JSON (a batch file's line, a create's body) is checked here and refused with a
reason (`json_checked`); a backend's answer, which is stored whatever it holds, is made storable
(`json_storable`).
"""

from __future__ import annotations

import json
import math
import re

MAX_DEPTH = 128  # objects and arrays nested in one client document
NUL = "\x00"
REPLACEMENT = "\ufffd"  # a NUL in a backend's answer, as stored
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")  # \u0000 after an even number of backslashes


class JsonRefused(ValueError):
    """Client JSON that is not stored: ``reason`` says why (without naming where it came from)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _no_constant(name: str) -> object:
    raise JsonRefused(f"{name} is not a JSON value.")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400
        raise JsonRefused(f"the number {text[:32]} is out of range.")
    return number


def _finite_or_none(text: str) -> float | None:
    number = float(text)
    return number if math.isfinite(number) else None


def json_checked(raw: bytes | str) -> object:
    """``raw`` parsed; JsonRefused if it is not JSON, holds NaN or Infinity, a NUL character in a
    string or key, or nests deeper than MAX_DEPTH."""
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except JsonRefused:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise JsonRefused("not valid JSON.") from None
    _walk(value)
    return value


def text_checked(value: str) -> str:
    """A client's string bound for a text column or a query (a path or query parameter)."""
    if NUL in value:
        raise JsonRefused("a string holds the character U+0000 (NUL), which is not accepted here.")
    return value


def _walk(value: object) -> None:
    """Depth and NUL of every node, without recursion (a deep document cannot exhaust the stack)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            text_checked(node)
        elif isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise JsonRefused(f"nested deeper than {MAX_DEPTH} levels.")
            if isinstance(node, dict):
                stack.extend((key, depth) for key in node)
                stack.extend((item, depth + 1) for item in node.values())
            else:
                stack.extend((item, depth + 1) for item in node)


def json_storable(raw: bytes) -> object:
    """A backend's answer as stored: NaN and Infinity as null, every NUL as U+FFFD; JsonRefused if
    it is not JSON or nests deeper than MAX_DEPTH (the caller stores its failure instead)."""
    try:  # a NUL can only be the escape \u0000 (strict JSON has no raw control character in a string)
        unescaped = _NUL_ESCAPE.sub(rb"\1\\ufffd", raw)
        value = json.loads(unescaped, parse_constant=lambda _name: None, parse_float=_finite_or_none)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise JsonRefused("not valid JSON.") from None
    _walk(value)
    return value
