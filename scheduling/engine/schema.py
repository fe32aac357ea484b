"""The scheduler configuration in YAML: parse and validate into ``SchedulerConfig``, and back.

``config_from_yaml`` keeps the line of every field (PyYAML's node API), so each problem is
reported as ``file:line: field: why``; all problems are collected before raising ``ConfigError``.
Decimal fields (prices, budgets) are read from the YAML text itself, never through a float.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

import yaml

from scheduling.engine.model import (
    AgingSegment,
    BackendSpec,
    Boost,
    ClassSpec,
    DowngradeRule,
    HeadroomPolicy,
    QueuePolicy,
    SchedulerConfig,
    TenantSpec,
)
from scheduling.engine.schema_headroom import headroom_dict
from scheduling.engine.schema_parties import kind_of
from scheduling.engine.schema_sections import build_sections, format_ratio
from scheduling.engine.schema_upstream import upstream_dict

_REQUIRED = object()


class ConfigIssue(NamedTuple):
    source: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.field}: {self.message}"


class ConfigError(ValueError):
    def __init__(self, issues: list[ConfigIssue]) -> None:
        super().__init__("\n".join(str(issue) for issue in issues))
        self.issues = issues


class Checker:
    """Collects issues; each check returns the converted value or None (after recording why)."""

    def __init__(self, source: str, lines: dict[str, int] | None) -> None:
        self.source, self.lines = source, lines
        self.issues: list[ConfigIssue] = []

    def line(self, path: str) -> int | None:
        while self.lines is not None and path:
            if path in self.lines:
                return self.lines[path]
            path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
        return None

    def error(self, path: str, message: str, line: int | None = None) -> None:
        self.issues.append(ConfigIssue(self.source, line or self.line(path), path, message))

    def get(
        self,
        data: dict[str, Any],
        path: str,
        key: str,
        check: Callable[..., Any],
        *,
        default: Any = _REQUIRED,
        **options: Any,
    ) -> Any:
        value = data.get(key)
        if value is not None:
            return check(f"{path}.{key}", value, **options)
        if default is _REQUIRED:
            self.error(f"{path}.{key}", "is required")
        return None if default is _REQUIRED else default

    def mapping(self, path: str, value: Any, keys: Collection[str] | None = None) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.error(path, f"must be a mapping, got {kind_of(value)}")
            return None
        for key in value:
            if keys is not None and key not in keys:
                self.error(f"{path}.{key}", f"unknown key {key!r}; expected one of: {', '.join(keys)}")
        return value

    def sequence(self, path: str, value: Any, *, non_empty: bool = False) -> list[Any] | None:
        if not isinstance(value, list):
            self.error(path, f"must be a list, got {kind_of(value)}")
            return None
        if non_empty and not value:
            self.error(path, "must not be empty")
        return value

    def integer(self, path: str, value: Any, *, minimum: int, maximum: int | None = None) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"must be an integer, got {kind_of(value)}")
        elif value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            self.error(path, f"must be an integer {bound}, got {value}")
        else:
            return value
        return None

    def decimal(self, path: str, value: Any, *, positive: bool = False) -> Decimal | None:
        amount = None
        if isinstance(value, (Decimal, int, float, str)) and not isinstance(value, bool):
            try:
                amount = Decimal(str(value).strip())
            except InvalidOperation:
                pass
        if amount is None or not amount.is_finite():
            self.error(path, f"must be a decimal number, got {kind_of(value)}")
            return None
        if amount < 0 or (positive and amount == 0):
            self.error(path, f"must be {'> 0' if positive else '>= 0'}, got {value}")
            return None
        return amount

    def real(
        self, path: str, value: Any, *, low: float, high: float | None = None, open_low: bool = False, rule: str = ""
    ) -> float | None:
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)) or not Decimal(value).is_finite():
            self.error(path, f"must be a number, got {kind_of(value)}")
            return None
        number = float(value)
        if number < low or (open_low and number == low) or (high is not None and number > high):
            self.error(path, f"must be {rule or f'>= {low:g}'}, got {value}")
            return None
        return number

    def text(self, path: str, value: Any, *, pattern: re.Pattern[str] | None = None, hint: str = "") -> str | None:
        if not isinstance(value, str) or not value.strip():
            self.error(path, f"must be a non-empty string, got {kind_of(value)}")
        elif pattern is not None and not pattern.fullmatch(value):
            self.error(path, f"{value!r} is not valid: expected {hint}")
        else:
            return value.strip()
        return None

    def flag(self, path: str, value: Any) -> bool | None:
        if isinstance(value, bool):
            return value
        self.error(path, f"must be true or false, got {kind_of(value)}")
        return None

    def choice(self, path: str, value: Any, *, options: dict[Any, Any]) -> Any:
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value in options:
            return options[value]
        shown = ", ".join(dict.fromkeys(str(k) for k in options))
        self.error(path, f"{value!r} is not one of: {shown}")
        return None


# --- public API ------------------------------------------------------------------------


def config_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> SchedulerConfig:
    """Validate the mapping found under ``scheduler:`` (no line numbers are known then)."""
    return _build(Checker(source, None), data)


def _build(ck: Checker, raw: Any) -> SchedulerConfig:
    fields = build_sections(ck, raw)
    if fields is None or ck.issues:
        raise ConfigError(sorted(ck.issues, key=lambda issue: (issue.line is None, issue.line or 0)))
    return SchedulerConfig(**fields)


def config_from_yaml(text: str, *, source: str = "<string>", also: tuple[str, ...] = ()) -> SchedulerConfig:
    """Parse a YAML document whose top level is ``scheduler:`` (and ``also``'s keys, which the caller
    reads); raises ConfigError listing every problem."""
    lines: dict[str, int] = {}
    ck = Checker(source, lines)
    document = read_yaml(text, lines, ck.error)
    for key in document if isinstance(document, dict) else ():
        if key != "scheduler" and key not in also:
            expected = " or ".join(repr(k) for k in ("scheduler", *also))
            ck.error(key, f"unknown top-level key {key!r}; expected only {expected}")
    if not isinstance(document, dict) or "scheduler" not in document:
        if not ck.issues or document is not None:
            ck.error("scheduler", "the file must have a top-level 'scheduler:' mapping")
        raise ConfigError(ck.issues)
    return _build(ck, document["scheduler"])


def config_to_dict(config: SchedulerConfig) -> dict[str, Any]:
    """The mapping under ``scheduler:``, in the same schema (Decimal values stay Decimal)."""
    data: dict[str, Any] = {
        "policy": config.policy.value,
        "classes": [_class_dict(c) for c in config.classes],
        "aging": {"mode": config.aging.mode, "segments": [_segment_dict(s) for s in config.aging.segments]},
        "tenant_fairness": {
            "mode": config.fairness.mode.value,
            "weight_source": config.fairness.weight_source,
            "min_share": config.fairness.min_share,
        },
        "queue": _queue_dict(config.queue),
    }
    if config.headroom != HeadroomPolicy():  # next to the aging curve
        data = {key: data[key] for key in ("policy", "classes", "aging")} | {
            "headroom": headroom_dict(config.headroom),
            **data,
        }
    if config.networks:
        data["networks"] = {name: list(cidrs) for name, cidrs in config.networks.items()}
    data["downgrade_check"] = [_rule_dict(r) for r in sorted(config.downgrade_rules, key=lambda r: r.order)]
    if config.tenants is not None:
        data["tenants"] = [_tenant_dict(t) for t in config.tenants]
    if config.backends is not None:
        data["backends"] = [_backend_dict(b) for b in config.backends]
    return data


def config_to_yaml(config: SchedulerConfig) -> str:
    return write_yaml({"scheduler": config_to_dict(config)})


def _class_dict(c: ClassSpec) -> dict[str, Any]:
    data = {"name": c.name, "level": c.level, "sla_ms": c.sla_ms, "price_factor": c.price_factor}
    return data if c.active else {**data, "active": False}


def _segment_dict(s: AgingSegment) -> dict[str, Any]:
    data: dict[str, Any] = {"wait_ratio": format_ratio(s.lo, s.hi), "boost": s.boost.value}
    return {**data, "k": s.k} if s.boost in (Boost.LINEAR, Boost.QUADRATIC) or s.k else data


def _queue_dict(q: QueuePolicy) -> dict[str, Any]:
    defaults = QueuePolicy()
    data = {
        "depth_formula": q.depth_formula,
        "depth_cap": q.depth_cap,
        "on_full": q.on_full,
        "on_timeout": q.on_timeout,
    }
    extras = (
        "enforce_depth",
        "enforce_deadline",
        "honour_cancel",
        "single_queue",
        "service_ms_prior",
        "admission",
        "predict_margin",
        "fast_fail",
        "prior_weight",
        "margin_after_ms",
    )
    return {**data, **{f: getattr(q, f) for f in extras if getattr(q, f) != getattr(defaults, f)}}


def _rule_dict(r: DowngradeRule) -> dict[str, Any]:
    data = {"name": r.name, "if": r.condition, "action": r.action}
    return data if r.enabled else {**data, "enabled": False}


def _tenant_dict(t: TenantSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"slug": t.slug}
    if t.name:
        data["name"] = t.name
    data["quota_share"] = t.quota_share
    if t.annual_budget is not None:
        data["annual_budget"] = t.annual_budget
    if t.classes:
        data["classes"] = list(t.classes)
    if t.vip:
        data["vip"] = True
    return data if t.active else {**data, "active": False}


def _backend_dict(b: BackendSpec) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": b.name,
        "url": b.url,
        "models": list(b.models),
        "slots": b.slots,
        "tpm": b.tpm,
        "rpm": b.rpm,
        "input_price_per_1k": b.input_price_per_1k,
        "output_price_per_1k": b.output_price_per_1k,
        "fallback_for": b.fallback_for,
        "reserved_slots": b.reserved_slots,
        "embedding_models": list(b.embedding_models) or None,
        **upstream_dict(b),
    }
    data = {k: v for k, v in data.items() if v is not None and v != ""}
    return data if b.enabled else {**data, "enabled": False}


# --- YAML reading (with the line of every field) and writing ---------------------------

_FLOAT_TAG = "tag:yaml.org,2002:float"


class _NodeReader:
    """Turns a composed YAML node tree into plain data, recording each field's line."""

    def __init__(self, lines: dict[str, int], error: Callable[..., None]) -> None:
        self.lines, self.error = lines, error
        self.constructor = yaml.constructor.SafeConstructor()
        self.open_nodes: set[int] = set()

    def read(self, node: yaml.Node, path: str) -> Any:
        if id(node) in self.open_nodes:
            self.error(path, "recursive YAML alias", node.start_mark.line + 1)
            return None
        self.open_nodes.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                return [self.item(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
            return self.scalar(node, path)
        finally:
            self.open_nodes.discard(id(node))

    def item(self, node: yaml.Node, path: str) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        return self.read(node, path)

    def mapping(self, node: yaml.MappingNode, path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.error(path, "mapping keys must be plain names", line)
                continue
            key = key_node.value
            child = f"{path}.{key}" if path else key
            if key in result:
                self.error(child, f"duplicate key {key!r}", line)
            self.lines.setdefault(child, line)
            result[key] = self.read(value_node, child)
        return result

    def scalar(self, node: yaml.Node, path: str) -> Any:
        if node.tag == _FLOAT_TAG:  # keep the written digits: 1.6 -> Decimal("1.6")
            try:
                return Decimal(node.value.replace("_", ""))
            except InvalidOperation:
                pass
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.error(path, f"cannot read value: {getattr(exc, 'problem', exc)}", node.start_mark.line + 1)
            return None


def read_yaml(text: str, lines: dict[str, int], error: Callable[..., None]) -> Any:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        context = getattr(exc, "context", None)
        problem = getattr(exc, "problem", None) or str(exc)
        error("(yaml)", f"{context + ': ' if context else ''}{problem}", mark.line + 1 if mark else None)
        return None
    return None if node is None else _NodeReader(lines, error).read(node, "")


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)  # indent list items under their key


class _Flow(dict[str, Any]):
    pass


class _FlowList(list[Any]):
    pass


def _represent_decimal(dumper: yaml.SafeDumper, value: Decimal) -> yaml.Node:
    text = format(value, "f")
    return dumper.represent_scalar(_FLOAT_TAG if "." in text else "tag:yaml.org,2002:int", text)


_Dumper.add_representer(Decimal, _represent_decimal)
_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v, flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def write_yaml(document: dict[str, Any]) -> str:
    data = document["scheduler"]
    for key in ("classes", "downgrade_check", "tenants"):
        if key in data:
            data[key] = [_Flow(item) for item in data[key]]
    data["aging"]["segments"] = [_Flow(item) for item in data["aging"]["segments"]]
    data.get("networks", {}).update({k: _FlowList(v) for k, v in data.get("networks", {}).items()})
    for backend in data.get("backends", []):
        backend["models"] = _FlowList(backend["models"])
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=200, default_flow_style=False)
