"""What a call to a backend carries: its credential and extra headers, and its dialect's URL.

The configuration names environment variables only (``api_key_env``, header values ``env:NAME``);
their values are read here, from the environment of the process making the call (a gateway, a
Celery worker), and go nowhere else: not the database, a log line, an error or the console.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from django.core.exceptions import ValidationError

from scheduling.engine.model import BackendSpec, Dialect
from scheduling.engine.schema import Checker
from scheduling.engine.schema_upstream import ENV_PREFIX, env_name_of, upstream_fields


class CredentialMissing(Exception):
    """A backend names an environment variable that this process does not have."""

    def __init__(self, backend: str, variable: str) -> None:
        super().__init__(f"backend {backend!r} needs the environment variable {variable} (set it for every process)")
        self.backend = backend
        self.variable = variable


def env_names(spec: BackendSpec) -> list[str]:
    """The environment variables a backend's calls read."""
    names = [spec.api_key_env] if spec.api_key_env else []
    return names + [name for _, value in spec.headers if (name := env_name_of(value))]


def missing_env(backends: Iterable[BackendSpec], environ: Mapping[str, str] | None = None) -> list[CredentialMissing]:
    """Each variable named by an enabled backend that is unset (or empty) here."""
    environ = os.environ if environ is None else environ
    return [
        CredentialMissing(spec.name, name)
        for spec in backends
        if spec.enabled
        for name in env_names(spec)
        if not environ.get(name)
    ]


def _secret(spec: BackendSpec, name: str, environ: Mapping[str, str]) -> str:
    value = environ.get(name)
    if not value:
        raise CredentialMissing(spec.name, name)
    return value


def upstream_headers(spec: BackendSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers a call to ``spec`` adds to the gateway's own: extra headers, then the key
    (``Authorization: Bearer``, or Azure's ``api-key``). Raises CredentialMissing."""
    environ = os.environ if environ is None else environ
    headers = {
        name: _secret(spec, value[len(ENV_PREFIX) :], environ) if value.startswith(ENV_PREFIX) else value
        for name, value in spec.headers
    }
    if spec.api_key_env:
        key = _secret(spec, spec.api_key_env, environ)
        if spec.dialect == Dialect.AZURE:
            headers["api-key"] = key
        else:
            headers["Authorization"] = f"Bearer {key}"
    return headers


def upstream_path(spec: BackendSpec, path: str, body: bytes = b"") -> str:
    """The path (after the backend's URL) of an OpenAI ``path`` such as ``/chat/completions``:
    itself, or Azure's ``/openai/deployments/{deployment}{path}?api-version=...``."""
    if spec.dialect != Dialect.AZURE:
        return path
    deployment = spec.deployment or _model_of(body)
    return f"/openai/deployments/{quote(deployment, safe='')}{path}?api-version={quote(spec.api_version or '')}"


def _model_of(body: bytes) -> str:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        model = None
    return model if isinstance(model, str) else ""


def backend_upstream_check(*, name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The BackendSpec upstream fields of command-line options, checked as the YAML's are
    (ValidationError naming each problem)."""
    ck = Checker("--options", None)
    fields = upstream_fields(ck, f"backend {name}", {k: v for k, v in raw.items() if v is not None})
    if ck.issues:
        raise ValidationError([f"{issue.field}: {issue.message}" for issue in ck.issues])
    return fields


def backend_upstream_shown(backend: BackendSpec | Any) -> str:
    """How the console and ``backend list`` show a backend's upstream: variable names as
    ``env:NAME``, never a value read from them (a BackendSpec or a Backend row)."""
    parts = [f"key env:{backend.api_key_env}"] if backend.api_key_env else []
    dialect = getattr(backend.dialect, "value", backend.dialect)
    if dialect == Dialect.AZURE.value:
        parts.append(f"azure {backend.deployment or '(model)'} api-version={backend.api_version}")
    headers = backend.headers.items() if isinstance(backend.headers, dict) else backend.headers
    parts += [f"{name}: {value}" for name, value in headers]
    return " · ".join(parts)
