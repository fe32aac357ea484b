"""The ``tenants:`` and ``backends:`` sections of the scheduler configuration (see ``schema.py``).

Builders like those of ``schema_sections``: each takes the raw value and a checker that records
problems with their field path, and returns the specs it could build.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from scheduling.engine.model import BackendSpec, TenantSpec
from scheduling.engine.schema_upstream import KEYS as UPSTREAM_KEYS
from scheduling.engine.schema_upstream import upstream_fields

if TYPE_CHECKING:
    from scheduling.engine.schema import Checker

SLUG = re.compile(r"[A-Za-z0-9_-]+")
BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def kind_of(value: Any) -> str:
    """How a wrong value is shown in a message: ``text 'abc'``, ``number 1.5``, ``a list``."""
    if value is None or isinstance(value, bool):
        return {None: "nothing", True: "true", False: "false"}[value]
    if isinstance(value, (int, float, Decimal)):
        return f"number {value}"
    if isinstance(value, str):
        return f"text {value!r}"
    containers: dict[type, str] = {list: "a list", dict: "a mapping"}
    return containers.get(type(value), type(value).__name__)


def unique(ck: Checker, path: str, values: list[Any], key: str, what: str) -> None:
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            if value in seen:
                ck.error(f"{path}[{i}].{key}", f"duplicate {what} {value!r}")
            seen.add(value)


def _name_list(ck: Checker, path: str, value: Any, *, known: set[str] | None = None) -> tuple[str, ...] | None:
    entries = ck.sequence(path, value)
    if entries is None:
        return None
    names = [ck.text(f"{path}[{i}]", e) for i, e in enumerate(entries)]
    for i, name in enumerate(names):
        if name is not None and known is not None and name not in known:
            ck.error(f"{path}[{i}]", f"unknown class {name!r} (classes: {', '.join(sorted(known))})")
        elif name is not None and names.index(name) < i:
            ck.error(f"{path}[{i}]", f"{name!r} is listed twice")
    return tuple(n for n in names if n is not None)


def _tenant(ck: Checker, path: str, raw: Any, classes: set[str]) -> TenantSpec | None:
    keys = ("slug", "name", "quota_share", "annual_budget", "classes", "vip", "active")
    data, start = ck.mapping(path, raw, keys), len(ck.issues)
    if data is None:
        return None
    spec = TenantSpec(
        slug=ck.get(data, path, "slug", ck.text, pattern=SLUG, hint="letters, digits, '-' and '_'"),
        name=ck.get(data, path, "name", ck.text, default=""),
        quota_share=ck.get(
            data,
            path,
            "quota_share",
            ck.real,
            low=0.0,
            high=1.0,
            open_low=True,
            rule="in (0, 1] (0 < quota_share <= 1)",
        ),
        annual_budget=ck.get(data, path, "annual_budget", ck.decimal, default=None),
        classes=ck.get(data, path, "classes", _bind(_name_list, ck), known=classes, default=()),
        vip=ck.get(data, path, "vip", ck.flag, default=False),
        active=ck.get(data, path, "active", ck.flag, default=True),
    )
    return spec if len(ck.issues) == start else None


def _bind(func: Callable[..., Any], ck: Checker) -> Callable[..., Any]:
    return lambda path, value, **options: func(ck, path, value, **options)


def _url(ck: Checker, path: str, value: Any) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", value.strip()):
        return value.strip()
    ck.error(path, f"must be an http:// or https:// URL, got {kind_of(value)}")
    return None


def _backend(ck: Checker, path: str, raw: Any) -> BackendSpec | None:
    keys = (
        "name",
        "url",
        "models",
        "slots",
        "tpm",
        "rpm",
        "input_price_per_1k",
        "output_price_per_1k",
        "fallback_for",
        "reserved_slots",
        "enabled",
        "embedding_models",
        *UPSTREAM_KEYS,
    )
    data, start = ck.mapping(path, raw, keys), len(ck.issues)
    if data is None:
        return None
    slots = ck.get(data, path, "slots", ck.integer, minimum=1)
    spec = BackendSpec(
        name=ck.get(data, path, "name", ck.text, pattern=BACKEND_NAME, hint="letters, digits, '-', '_', '.'"),
        url=ck.get(data, path, "url", _bind(_url, ck), default=""),
        models=ck.get(data, path, "models", _bind(_name_list, ck)),
        slots=slots,
        tpm=ck.get(data, path, "tpm", ck.integer, minimum=1, default=None),
        rpm=ck.get(data, path, "rpm", ck.integer, minimum=1, default=None),
        input_price_per_1k=ck.get(data, path, "input_price_per_1k", ck.decimal, default=Decimal("0")),
        output_price_per_1k=ck.get(data, path, "output_price_per_1k", ck.decimal, default=Decimal("0")),
        fallback_for=ck.get(data, path, "fallback_for", ck.text, default=None),
        reserved_slots=ck.get(data, path, "reserved_slots", ck.integer, minimum=0, maximum=slots, default=0)
        if slots is not None
        else 0,
        enabled=ck.get(data, path, "enabled", ck.flag, default=True),
        embedding_models=ck.get(data, path, "embedding_models", _bind(_name_list, ck), default=()),
        **upstream_fields(ck, path, data),
    )
    if spec.models == ():
        ck.error(f"{path}.models", "must list at least one model")
    for i, name in enumerate(spec.embedding_models or ()):
        if spec.models is not None and name not in spec.models:
            ck.error(f"{path}.embedding_models[{i}]", f"{name!r} must be one of this backend's models")
    return spec if len(ck.issues) == start else None


def backends_section(ck: Checker, raw: Any) -> list[BackendSpec]:
    path = "scheduler.backends"
    entries = ck.sequence(path, raw) or []
    specs = [_backend(ck, f"{path}[{i}]", e) for i, e in enumerate(entries)]
    unique(ck, path, [s.name if s else None for s in specs], "name", "backend name")
    names = {e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)}
    for i, spec in enumerate(specs):
        target = spec.fallback_for if spec else None
        if spec is not None and target is not None and (target == spec.name or target not in names):
            ck.error(f"{path}[{i}].fallback_for", f"{target!r} must name another backend of this file")
    return [s for s in specs if s is not None]


def tenants_section(ck: Checker, raw: Any, classes: set[str]) -> tuple[TenantSpec, ...]:
    path = "scheduler.tenants"
    entries = ck.sequence(path, raw) or []
    specs = [_tenant(ck, f"{path}[{i}]", e, classes) for i, e in enumerate(entries)]
    unique(ck, path, [s.slug if s else None for s in specs], "slug", "tenant slug")
    return tuple(s for s in specs if s is not None)
