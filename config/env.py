"""Typed environment helpers that fail loudly: a bad value stops start-up with a clear message."""

from __future__ import annotations

import ipaddress
import os
from decimal import Decimal, InvalidOperation
from typing import overload
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_decimal(name: str, default: str) -> Decimal:
    raw = os.environ.get(name, default)
    try:
        return Decimal(raw)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a decimal number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_origin(name: str) -> str:
    """An origin, ``http(s)://host[:port]`` without a path ("" when unset), as browsers send it."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return ""
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        parts, port = urlsplit(""), None
    extra = parts.path not in ("", "/") or parts.query or parts.fragment or parts.username is not None
    if parts.scheme not in ("http", "https") or not parts.hostname or extra:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an origin like https://llm.example.com (no path)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default_port = {"http": 80, "https": 443}[parts.scheme]  # browsers leave it out of an Origin
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default_port) else "")


def env_networks(name: str) -> list[str]:
    """Comma-separated IP addresses or CIDRs (empty when unset)."""
    networks = env_list(name, [])
    for item in networks:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an IP address or CIDR") from None
    return networks


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def env_output_limits(name: str) -> dict[str, tuple[int, int]]:
    """``model=default/max`` pairs, comma-separated: model -> (default, maximum) output tokens."""
    raw = os.environ.get(name, "")
    limits: dict[str, tuple[int, int]] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        model, _, pair = item.rpartition("=")
        default, _, maximum = pair.partition("/")
        try:
            values = int(default), int(maximum)
        except ValueError:
            values = (0, 0)
        if not model or values[0] < 1 or values[1] < values[0]:
            raise ImproperlyConfigured(f"{name}: {item!r} is not model=DEFAULT/MAX with 1 <= DEFAULT <= MAX")
        limits[model] = values
    return limits
