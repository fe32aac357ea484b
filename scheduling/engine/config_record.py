"""The engine's configuration (`SchedulerConfig` and the specs in it) as a plain record and back.

A record holds only dicts, lists, strings, numbers, booleans and None (msgpack or JSON carry it):
enums as their values, ``Decimal`` as its text, tuples as lists. Reading one rebuilds each
dataclass from its field types, so a record written by this version reads back equal.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from decimal import Decimal
from enum import Enum
from functools import cache
from typing import Any

from .model import BackendSpec, SchedulerConfig, TenantSpec


def to_plain(value: Any) -> Any:
    """``value`` (a dataclass, enum, Decimal, tuple, list, dict or scalar) as plain data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [to_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    return value


@cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_plain(kind: Any, value: Any) -> Any:
    """Plain ``value`` read as type ``kind`` (the annotation of the field that held it)."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return from_plain(options[0], value)
    if origin is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], item) for item in value)
        return tuple(from_plain(arg, item) for arg, item in zip(args, value, strict=True))
    if origin is dict:
        key_kind, item_kind = typing.get_args(kind)
        return {from_plain(key_kind, key): from_plain(item_kind, item) for key, item in value.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = _field_types(kind)
        names = {f.name for f in dataclasses.fields(kind)}
        return kind(**{name: from_plain(hints[name], item) for name, item in value.items() if name in names})
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if kind is Decimal:
        return Decimal(value)
    return value


def config_to_record(config: SchedulerConfig) -> dict[str, Any]:
    return to_plain(config)  # type: ignore[no-any-return]


def config_from_record(record: dict[str, Any]) -> SchedulerConfig:
    return from_plain(SchedulerConfig, record)  # type: ignore[no-any-return]


def tenant_from_record(record: dict[str, Any]) -> TenantSpec:
    return from_plain(TenantSpec, record)  # type: ignore[no-any-return]


def backend_from_record(record: dict[str, Any]) -> BackendSpec:
    return from_plain(BackendSpec, record)  # type: ignore[no-any-return]
