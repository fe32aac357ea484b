"""Validation of each section of the scheduler configuration (see ``schema.py``).

Each builder takes the raw value of its section and a checker that records problems with
their field path; it returns the value object, or None when something was wrong.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from scheduling.engine.model import (
    RESERVED_RULE_NAMES,
    AgingPolicy,
    AgingSegment,
    Boost,
    ClassSpec,
    DowngradeRule,
    FairnessMode,
    FairnessPolicy,
    HeadroomPolicy,
    Policy,
    QueuePolicy,
)
from scheduling.engine.rules import RuleSyntaxError, condition_names, parse_condition
from scheduling.engine.schema_headroom import headroom_section
from scheduling.engine.schema_parties import backends_section, kind_of, tenants_section, unique

if TYPE_CHECKING:
    from scheduling.engine.schema import Checker

SECTIONS = (
    "policy",
    "classes",
    "aging",
    "headroom",
    "tenant_fairness",
    "queue",
    "networks",
    "downgrade_check",
    "tenants",
    "backends",
)
UPPER_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
RULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
DEPTH_FORMULA = "throughput_1m * sla_sec"
ADMISSIONS = ("depth", "predicted")  # queue.admission: the depth limit, or by predicted dispatch
# with fast_fail (a flag): see prediction.py
PREDICTION_KEYS = ("admission", "predict_margin", "prior_weight", "margin_after_ms")
BOOSTS: dict[int | str, Boost] = {0: Boost.NONE, "0": Boost.NONE, **{b.value: b for b in Boost}}
BOOST_RANK = {Boost.NONE: 0, Boost.LINEAR: 1, Boost.QUADRATIC: 2, Boost.PREEMPT: 3}
ACTION_PREFIX = "DOWNGRADE_TO_"
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"


def parse_ratio(text: str) -> tuple[float, float | None] | None:
    """``"0.5-0.8"`` -> (0.5, 0.8); ``">=0.95"`` -> (0.95, None); None if malformed or empty."""
    closed = re.fullmatch(rf"\s*{_NUMBER}\s*-\s*{_NUMBER}\s*", text)
    if closed:
        lo, hi = float(closed.group(1)), float(closed.group(2))
        return (lo, hi) if lo < hi else None
    open_ended = re.fullmatch(rf"\s*>=\s*{_NUMBER}\s*", text)
    return (float(open_ended.group(1)), None) if open_ended else None


def format_ratio(lo: float, hi: float | None) -> str:
    def number(x: float) -> str:
        text = format(Decimal(repr(x)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text

    return f">={number(lo)}" if hi is None else f"{number(lo)}-{number(hi)}"


def _class(ck: Checker, path: str, raw: Any) -> ClassSpec | None:
    data, start = ck.mapping(path, raw, ("name", "level", "sla_ms", "price_factor", "active")), len(ck.issues)
    if data is None:
        return None
    spec = ClassSpec(
        name=ck.get(data, path, "name", ck.text, pattern=UPPER_NAME, hint="an uppercase identifier like NEAR_RT"),
        level=ck.get(data, path, "level", ck.integer, minimum=0),
        sla_ms=ck.get(data, path, "sla_ms", ck.integer, minimum=1),
        price_factor=ck.get(data, path, "price_factor", ck.decimal, positive=True),
        active=ck.get(data, path, "active", ck.flag, default=True),
    )
    return spec if len(ck.issues) == start else None


def _classes(ck: Checker, raw: Any) -> tuple[list[ClassSpec], set[str]]:
    path = "scheduler.classes"
    entries = ck.sequence(path, raw, non_empty=True) or []
    specs = [_class(ck, f"{path}[{i}]", entry) for i, entry in enumerate(entries)]
    names = {e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)}
    unique(ck, path, [e.get("name") if isinstance(e, dict) else None for e in entries], "name", "class name")
    unique(ck, path, [e.get("level") if isinstance(e, dict) else None for e in entries], "level", "class level")
    return [s for s in specs if s is not None], names


def _segment(ck: Checker, path: str, raw: Any) -> AgingSegment | None:
    data, start = ck.mapping(path, raw, ("wait_ratio", "boost", "k")), len(ck.issues)
    if data is None:
        return None
    bounds = ck.get(data, path, "wait_ratio", _ratio_check(ck))
    boost = ck.get(data, path, "boost", ck.choice, options=BOOSTS)
    k = ck.get(data, path, "k", ck.real, low=0.0, default=None)
    if boost in (Boost.LINEAR, Boost.QUADRATIC) and data.get("k") is None:
        ck.error(f"{path}.k", f"is required for boost {boost.value!r} (a number >= 0)")
    if boost in (Boost.NONE, Boost.PREEMPT) and k:
        ck.error(f"{path}.k", f"only applies to linear and quadratic boosts, not {boost.value!r}")
    if len(ck.issues) > start:
        return None
    return AgingSegment(lo=bounds[0], hi=bounds[1], boost=boost, k=k or 0.0)


def _ratio_check(ck: Checker) -> Callable[[str, Any], tuple[float, float | None] | None]:
    def check(path: str, value: Any) -> tuple[float, float | None] | None:
        bounds = parse_ratio(value) if isinstance(value, str) else None
        if bounds is None:
            ck.error(path, f'must be a string "a-b" or ">=a" with a < b, got {kind_of(value)}')
        return bounds

    return check


def _segment_chain(ck: Checker, path: str, segments: list[AgingSegment]) -> None:
    for i, seg in enumerate(segments):
        where = f"{path}[{i}].wait_ratio"
        prev = segments[i - 1] if i else None
        if prev is None:
            if seg.lo != 0:
                ck.error(where, f"the first segment must start at 0, not {seg.lo:g}")
        elif prev.hi is None:
            ck.error(f"{path}[{i - 1}].wait_ratio", 'only the last segment may be open-ended (">=a")')
        elif seg.lo < prev.hi:
            ck.error(where, f"overlaps the previous segment, which ends at {prev.hi:g}")
        elif seg.lo > prev.hi:
            ck.error(where, f"leaves a gap after {prev.hi:g}: segments must be contiguous")
        if prev is not None and BOOST_RANK[seg.boost] < BOOST_RANK[prev.boost]:
            ck.error(
                f"{path}[{i}].boost",
                f"{seg.boost.value!r} after {prev.boost.value!r}: "
                "boosts must not weaken as the wait grows (none, linear, quadratic, preempt)",
            )
    if segments and segments[-1].hi is not None:
        ck.error(f"{path}[{len(segments) - 1}].wait_ratio", 'the last segment must be open-ended, e.g. ">=0.95"')


def _aging(ck: Checker, raw: Any) -> AgingPolicy | None:
    path = "scheduler.aging"
    data, start = ck.mapping(path, raw, ("mode", "segments")), len(ck.issues)
    if data is None:
        return None
    mode = ck.get(
        data, path, "mode", ck.choice, options={m: m for m in ("piecewise", "linear", "none")}, default="piecewise"
    )
    entries = ck.get(data, path, "segments", ck.sequence, default=[]) or []
    checked = [_segment(ck, f"{path}.segments[{i}]", e) for i, e in enumerate(entries)]
    if len(ck.issues) > start:
        return None
    segments = [s for s in checked if s is not None]  # all of them: a None was recorded as an issue
    _segment_chain(ck, f"{path}.segments", segments)
    return AgingPolicy(mode=mode, segments=tuple(segments))


def _fairness(ck: Checker, raw: Any) -> FairnessPolicy | None:
    path = "scheduler.tenant_fairness"
    data = ck.mapping(path, raw, ("mode", "weight_source", "min_share"))
    if data is None:
        return None
    return FairnessPolicy(
        mode=ck.get(
            data,
            path,
            "mode",
            ck.choice,
            options={m.value: m for m in FairnessMode},
            default=FairnessMode.WEIGHTED_FAIR_TOKENS,
        ),
        weight_source=ck.get(
            data, path, "weight_source", ck.choice, options={"quota_share": "quota_share"}, default="quota_share"
        ),
        min_share=ck.get(
            data,
            path,
            "min_share",
            ck.real,
            low=0.0,
            high=1.0,
            default=FairnessPolicy.min_share,
            rule="between 0 and 1 (0 <= min_share <= 1)",
        ),
    )


def _queue(ck: Checker, raw: Any) -> QueuePolicy | None:
    path, defaults = "scheduler.queue", QueuePolicy()
    flags = ("enforce_depth", "enforce_deadline", "honour_cancel", "single_queue", "fast_fail")
    keys = ("depth_formula", "depth_cap", "on_full", "on_timeout", *flags, "service_ms_prior", *PREDICTION_KEYS)
    data = ck.mapping(path, raw, keys)
    if data is None:
        return None
    formula = data.get("depth_formula", DEPTH_FORMULA)
    if not isinstance(formula, str) or re.sub(r"\s+", "", formula) != DEPTH_FORMULA.replace(" ", ""):
        ck.error(f"{path}.depth_formula", f"only {DEPTH_FORMULA!r} is supported, got {kind_of(formula)}")
    return QueuePolicy(
        depth_formula=DEPTH_FORMULA,
        depth_cap=ck.get(data, path, "depth_cap", ck.integer, minimum=1, default=defaults.depth_cap),
        on_full=ck.get(
            data, path, "on_full", ck.choice, options={defaults.on_full: defaults.on_full}, default=defaults.on_full
        ),
        on_timeout=ck.get(
            data,
            path,
            "on_timeout",
            ck.choice,
            options={defaults.on_timeout: defaults.on_timeout},
            default=defaults.on_timeout,
        ),
        **{f: ck.get(data, path, f, ck.flag, default=getattr(defaults, f)) for f in flags},
        service_ms_prior=ck.get(
            data, path, "service_ms_prior", ck.integer, minimum=1, default=defaults.service_ms_prior
        ),
        admission=ck.get(
            data, path, "admission", ck.choice, options={m: m for m in ADMISSIONS}, default=defaults.admission
        ),
        predict_margin=ck.get(
            data,
            path,
            "predict_margin",
            ck.real,
            low=0.0,
            high=1.0,
            open_low=True,
            default=defaults.predict_margin,
            rule="in (0, 1] (0 < predict_margin <= 1)",
        ),
        prior_weight=ck.get(data, path, "prior_weight", ck.integer, minimum=0, default=defaults.prior_weight),
        margin_after_ms=ck.get(data, path, "margin_after_ms", ck.integer, minimum=0, default=defaults.margin_after_ms),
    )


def _cidr(ck: Checker, path: str, value: Any) -> str | None:
    if not isinstance(value, str):
        ck.error(path, f"must be a CIDR string such as 10.20.0.0/16, got {kind_of(value)}")
        return None
    try:
        return str(ipaddress.ip_network(value.strip()))
    except ValueError:
        pass
    try:
        fixed = ipaddress.ip_network(value.strip(), strict=False)
        ck.error(path, f"{value!r} has host bits set; did you mean {fixed}?")
    except ValueError:
        ck.error(path, f"{value!r} is not a valid CIDR (e.g. 10.20.0.0/16 or 2001:db8::/32)")
    return None


def _networks(ck: Checker, raw: Any) -> dict[str, tuple[str, ...]]:
    path, networks = "scheduler.networks", {}
    for name, cidrs in (ck.mapping(path, raw) or {}).items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not UPPER_NAME.fullmatch(name):
            ck.error(where, f"network name {name!r} must be an uppercase identifier like BATCH_NET")
        entries = ck.sequence(where, cidrs, non_empty=True) or []
        parsed = [_cidr(ck, f"{where}[{i}]", c) for i, c in enumerate(entries)]
        networks[str(name)] = tuple(p for p in parsed if p is not None)
    return networks


def _rule(
    ck: Checker, path: str, raw: Any, position: int, classes: set[str], networks: set[str]
) -> DowngradeRule | None:
    data, start = ck.mapping(path, raw, ("name", "if", "action", "enabled")), len(ck.issues)
    if data is None:
        return None
    name = ck.get(
        data,
        path,
        "name",
        ck.text,
        pattern=RULE_NAME,
        hint="letters, digits, '-', '_', '.'",
        default=f"rule-{position}",
    )
    if name is not None and name.lower() in RESERVED_RULE_NAMES:
        ck.error(f"{path}.name", f"{name!r} is reserved (reserved: {', '.join(RESERVED_RULE_NAMES)})")
    condition = ck.get(data, path, "if", ck.text)
    if condition is not None:
        _check_condition(ck, f"{path}.if", condition, classes, networks)
    action = ck.get(data, path, "action", ck.text)
    if action is not None and not (action.startswith(ACTION_PREFIX) and action[len(ACTION_PREFIX) :] in classes):
        ck.error(
            f"{path}.action",
            f"unknown action {action!r}; expected {ACTION_PREFIX}<class>, one of: "
            + ", ".join(ACTION_PREFIX + c for c in sorted(classes)),
        )
    enabled = ck.get(data, path, "enabled", ck.flag, default=True)
    if len(ck.issues) > start:
        return None
    return DowngradeRule(name=name, condition=condition, action=action, enabled=enabled, order=position)


def _check_condition(ck: Checker, path: str, condition: str, classes: set[str], networks: set[str]) -> None:
    try:
        used_classes, used_networks = condition_names(parse_condition(condition))
    except RuleSyntaxError as exc:
        ck.error(path, f"cannot parse condition {condition!r}: {exc}")
        return
    for name in sorted(used_classes - classes):
        ck.error(path, f"unknown class {name!r} (classes: {', '.join(sorted(classes))})")
    for name in sorted(used_networks - networks):
        ck.error(path, f"unknown network {name!r}: declare it under scheduler.networks")


def _rules(ck: Checker, raw: Any, classes: set[str], networks: set[str]) -> list[DowngradeRule]:
    path = "scheduler.downgrade_check"
    entries = ck.sequence(path, raw) or []
    rules = [_rule(ck, f"{path}[{i}]", e, i + 1, classes, networks) for i, e in enumerate(entries)]
    unique(ck, path, [r.name if r else None for r in rules], "name", "rule name")
    return [r for r in rules if r is not None]


def build_sections(ck: Checker, raw: Any) -> dict[str, Any] | None:
    """Keyword arguments for ``SchedulerConfig`` from the mapping under ``scheduler:``;
    None if anything was wrong (the checker then holds every problem found)."""
    root = ck.mapping("scheduler", raw, SECTIONS)
    if root is None:
        return None
    classes: list[ClassSpec] = []
    class_names: set[str] = set()
    if root.get("classes") is None:
        ck.error("scheduler.classes", "is required (a list of priority classes)")
    else:
        classes, class_names = _classes(ck, root["classes"])
    networks = _networks(ck, root["networks"]) if "networks" in root else {}
    fields: dict[str, Any] = {
        "classes": tuple(classes),
        "policy": ck.get(
            root, "scheduler", "policy", ck.choice, options={p.value: p for p in Policy}, default=Policy.FAIRGATE
        ),
        "aging": _aging(ck, root["aging"]) if "aging" in root else AgingPolicy(),
        "headroom": headroom_section(ck, root["headroom"]) if "headroom" in root else HeadroomPolicy(),
        "fairness": _fairness(ck, root["tenant_fairness"]) if "tenant_fairness" in root else FairnessPolicy(),
        "queue": _queue(ck, root["queue"]) if "queue" in root else QueuePolicy(),
        "networks": networks,
        "downgrade_rules": tuple(_rules(ck, root.get("downgrade_check", []), class_names, set(networks))),
        "tenants": tenants_section(ck, root["tenants"], class_names) if "tenants" in root else None,
        "backends": tuple(backends_section(ck, root["backends"])) if "backends" in root else None,
    }
    return None if ck.issues else fields
