"""A backend's upstream fields in the scheduler YAML: its credential, extra headers and dialect.

``api_key_env`` (a variable's name), ``headers`` (a credential-looking header must take its value
from ``env:NAME``), ``dialect`` (``azure``: with ``api_version`` and ``deployment``). Only names of
environment variables are configuration. The fields: docs/upstreams.md.
"""

from __future__ import annotations

import re
from datetime import date
from typing import TYPE_CHECKING, Any

from scheduling.engine.model import Dialect

if TYPE_CHECKING:
    from scheduling.engine.schema import Checker

KEYS = ("api_key_env", "headers", "dialect", "deployment", "api_version")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_PREFIX = "env:"
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")
VALUE_TEXT = re.compile(r"[^\r\n\x00]+")
DEPLOYMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Headers the gateway writes itself: a backend may not override them.
OWN_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "accept-encoding", "x-request-id"}
    | {"traceparent", "tracestate", "authorization", "api-key"}
)
SECRET_WORDS = ("auth", "key", "token", "secret", "cookie", "password")


def env_name_of(value: str) -> str | None:
    """``NAME`` of a header value ``env:NAME``; None for a literal value."""
    return value[len(ENV_PREFIX) :] if value.startswith(ENV_PREFIX) else None


def upstream_fields(ck: Checker, path: str, data: dict[str, Any]) -> dict[str, Any]:
    """The BackendSpec keyword arguments of the upstream keys (issues recorded on ``ck``)."""
    env_hint = "an environment variable name (letters, digits, '_')"
    dialect = ck.get(data, path, "dialect", ck.choice, options={d.value: d for d in Dialect}, default=Dialect.OPENAI)
    fields: dict[str, Any] = {
        "api_key_env": ck.get(data, path, "api_key_env", ck.text, pattern=ENV_NAME, hint=env_hint, default=None),
        "headers": _headers(ck, f"{path}.headers", data.get("headers")) if data.get("headers") is not None else (),
        "dialect": dialect or Dialect.OPENAI,
        "deployment": ck.get(
            data, path, "deployment", ck.text, pattern=DEPLOYMENT, hint="a deployment name", default=None
        ),
        "api_version": ck.get(data, path, "api_version", lambda p, v: _version(ck, p, v), default=None),
    }
    if dialect == Dialect.AZURE and data.get("api_version") is None:
        ck.error(f"{path}.api_version", 'is required with dialect: azure (e.g. "2024-06-01")')
    if dialect != Dialect.AZURE:
        for key in ("deployment", "api_version"):
            if data.get(key) is not None:
                ck.error(f"{path}.{key}", "applies to dialect: azure only")
    return fields


def _version(ck: Checker, path: str, value: Any) -> str | None:
    """An api-version such as "2024-06-01" (an unquoted one is a YAML date: taken as written)."""
    text = value.isoformat() if isinstance(value, date) else value
    if isinstance(text, str) and re.fullmatch(r"[A-Za-z0-9.-]+", text):
        return text
    ck.error(path, f'must be an api-version such as "2024-06-01", got {value!r}')
    return None


def _headers(ck: Checker, path: str, raw: Any) -> tuple[tuple[str, str], ...]:
    data = ck.mapping(path, raw)
    if data is None:
        return ()
    pairs: list[tuple[str, str]] = []
    for name, value in data.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            ck.error(where, "a header name is letters, digits and '-'")
        elif name.lower() in OWN_HEADERS:
            ck.error(where, f"{name!r} is set by the gateway (the credential: api_key_env)")
        elif not isinstance(value, str) or not VALUE_TEXT.fullmatch(value):
            ck.error(where, 'must be a one-line string (or "env:NAME")')
        elif value.startswith(ENV_PREFIX) and not ENV_NAME.fullmatch(value[len(ENV_PREFIX) :]):
            ck.error(where, f"{value!r}: expected env:NAME, NAME an environment variable name")
        elif not value.startswith(ENV_PREFIX) and any(w in name.lower() for w in SECRET_WORDS):
            ck.error(where, f'{name!r} looks like a credential: give its value as "env:NAME", not in the file')
        else:
            pairs.append((name, value))
    return tuple(pairs)


def upstream_dict(spec: Any) -> dict[str, Any]:
    """The upstream keys of a backend's YAML mapping (only those that are set)."""
    data: dict[str, Any] = {}
    if spec.api_key_env:
        data["api_key_env"] = spec.api_key_env
    if spec.headers:
        data["headers"] = dict(spec.headers)
    if spec.dialect != Dialect.OPENAI:
        data["dialect"] = spec.dialect.value
    for key in ("deployment", "api_version"):
        if getattr(spec, key):
            data[key] = getattr(spec, key)
    return data
