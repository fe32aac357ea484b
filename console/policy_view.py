"""What the policy page shows: the live configuration, price versions, and the boost curve."""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone

from billing.incentives import factor_text as plain_factor
from billing.models import PriceVersion
from billing.price_versions import classes_with_price
from scheduling.engine.aging import AgingCurve
from scheduling.engine.model import AgingPolicy, FairnessMode
from scheduling.engine.schema_sections import format_ratio
from scheduling.models import Backend
from scheduling.selectors import config_live
from scheduling.upstreams import backend_upstream_shown
from tenants.models import Tenant

CURVE_STEP = 0.01
CURVE_MAX_RATIO = 1.2
VERSIONS_SHOWN = 4
FACTOR_PLACES = Decimal("0.0001")


def factor_text(value) -> str:
    """A price factor as written (the subquery may hand SQLite's float back as 1.60000000000000)."""
    if value is None:
        return "—"
    return plain_factor(Decimal(str(value)).quantize(FACTOR_PLACES))


def boost_curve(aging: AgingPolicy) -> dict:
    """Points of the boost (in class levels) against wait_ratio, and where preemption starts."""
    curve = AgingCurve(aging)
    ratios = [round(i * CURVE_STEP, 2) for i in range(int(CURVE_MAX_RATIO / CURVE_STEP) + 1)]
    points = [None if curve.preempts(r) else round(curve.boost(r), 4) for r in ratios]
    return {"ratios": ratios, "boost": points, "preempt_ratio": curve.preempt_ratio, "mode": aging.mode}


def segments_text(aging: AgingPolicy) -> str:
    lines = []
    for s in aging.segments:
        k = f" {s.k:g}" if s.boost.value in ("linear", "quadratic") else ""
        lines.append(f"{format_ratio(s.lo, s.hi)} {s.boost.value}{k}")
    return "\n".join(lines)


def _versions(class_names: list[str]) -> dict[str, list[PriceVersion]]:
    now = timezone.now()
    out: dict[str, list] = {name: [] for name in class_names}
    for version in (
        PriceVersion.objects.filter(priority_class__name__in=class_names)
        .select_related("priority_class")
        .order_by("-effective_at", "-pk")
    ):
        shown = out[version.priority_class.name]
        if len(shown) < VERSIONS_SHOWN:
            version.upcoming = version.effective_at > now
            version.factor_shown = factor_text(version.price_factor)
            shown.append(version)
    return out


def policy_context(feedback: dict | None = None) -> dict:
    config = config_live()
    classes = list(classes_with_price())
    versions = _versions([c.name for c in classes])
    for c in classes:
        c.versions = versions.get(c.name, [])
        c.price_factor = factor_text(c.price_factor)
    return {
        "feedback": feedback or {},
        "classes": classes,
        "aging": config.aging,
        "segments_text": segments_text(config.aging),
        "curve": boost_curve(config.aging),
        "aging_modes": ("piecewise", "linear", "none"),
        "fairness": config.fairness,
        "fairness_modes": [m.value for m in FairnessMode],
        "tenants": Tenant.objects.filter(active=True).order_by("slug"),
        "rules": config.downgrade_rules,
        "networks": config.networks,
        "actions": [f"DOWNGRADE_TO_{c.name}" for c in config.classes],
        "backends": _backends_shown(),
        "backend_names": list(Backend.objects.order_by("name").values_list("name", flat=True)),
    }


def _backends_shown() -> list[Backend]:
    """The backends, each with its upstream as shown (variable names, never their values)."""
    backends = list(Backend.objects.select_related("fallback_for").order_by("name"))
    for backend in backends:
        backend.upstream_shown = backend_upstream_shown(backend)
    return backends
