"""Plain value objects shared by the whole engine: the scheduler configuration and a request.

Nothing here knows about Django, Redis or the clock. The YAML schema (``schema.py``) builds
these objects, the Django models map to and from them, and the policy modules read them.
Times are integer milliseconds; money is ``Decimal``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from typing import NewType

DEFAULT_CLASSES = ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY")
RESERVED_RULE_NAMES = ("undeclared", "budget")


class Boost(str, Enum):
    NONE = "none"
    LINEAR = "linear"
    QUADRATIC = "quadratic"
    PREEMPT = "preempt"


class Dialect(str, Enum):
    """How a backend's API is addressed: OpenAI's paths and Bearer key, or Azure OpenAI's."""

    OPENAI = "openai"
    AZURE = "azure"


class FairnessMode(str, Enum):
    WEIGHTED_FAIR_TOKENS = "weighted_fair_tokens"
    WEIGHTED_ROUND_ROBIN = "weighted_round_robin"
    FIFO = "fifo"  # no tenant fairness: one FIFO per class (used by presets)


class Policy(str, Enum):
    FAIRGATE = "fairgate"
    FIFO = "fifo"
    STRICT = "strict"
    LINEAR = "linear"


@dataclass(frozen=True)
class ClassSpec:
    name: str
    level: int
    sla_ms: int
    price_factor: Decimal
    active: bool = True


@dataclass(frozen=True)
class AgingSegment:
    """Boost applied while ``lo <= wait_ratio < hi`` (``hi`` is None for the open last segment)."""

    lo: float
    hi: float | None
    boost: Boost
    k: float = 0.0


@dataclass(frozen=True)
class AgingPolicy:
    mode: str = "piecewise"  # "piecewise" | "linear" | "none"
    segments: tuple[AgingSegment, ...] = ()


@dataclass(frozen=True)
class FairnessPolicy:
    mode: FairnessMode = FairnessMode.WEIGHTED_FAIR_TOKENS
    weight_source: str = "quota_share"
    min_share: float = 0.02


@dataclass(frozen=True)
class QueuePolicy:
    depth_formula: str = "throughput_1m * sla_sec"
    depth_cap: int = 20000
    on_full: str = "REJECT_429_QUEUE_FULL"
    on_timeout: str = "REJECT_504_QUEUE_TIMEOUT"
    # Extensions of the field report's format (all optional in YAML):
    enforce_depth: bool = True
    enforce_deadline: bool = True
    honour_cancel: bool = True
    single_queue: bool = False  # one global FIFO across classes (the "fifo" preset)
    service_ms_prior: int = 20000  # mean service time assumed before any completion
    # Prediction (see ``prediction.py``; the default since issue 48, off in the fifo/strict/linear presets):
    admission: str = "predicted"  # "predicted": by predicted dispatch time; "depth": the dynamic depth limit
    predict_margin: float = 0.8  # share of the time to its deadline a predicted wait may take at admission
    fast_fail: bool = False  # fail a queued request (queue_timeout) once its predicted dispatch is past its deadline
    prior_weight: int = 0  # completions the prior is worth for a class with none yet (0: off)
    margin_after_ms: int = 0  # predict_margin applies to the time to the deadline beyond this (0: to all of it)


@dataclass(frozen=True)
class HeadroomPolicy:
    """Predictive headroom for the top class (``headroom.py``, ``forecast.py``); on by default since
    issue 48, bounded by the lower classes' deadlines (``deadline_share``); ``HEADROOM_OFF`` in the
    fifo/strict/linear presets. Why these defaults: docs/configuration.md, "The headroom section"."""

    enabled: bool = True
    horizon_ms: int = 4000  # hold when top-class arrivals are expected within this long
    hold_ms: int = 16000  # a freed slot stays free at most this long
    max_slots: int = 12  # at most this many slots held at once
    min_expected: float = 0.1  # expected top-class arrivals within the horizon that justify a hold
    bucket_ms: int = 300_000  # the time-of-day profile's bucket (divides a day)
    profile_alpha: float = 0.5  # weight of the newest day's count in its bucket's average
    recent_ms: int = 60_000  # time constant of the recent arrival rate
    profile_weight: float = 0.5  # the profile's share of the forecast (the rest: the recent rate)
    hold_idle: bool = True  # also hold free slots that did not just free (an idle pool filled at once)
    miss_share: float = 0.015  # > 0: hold no more than the pool's turnover needs so that this share of top-class
    # arrivals finds no held slot (0: the need is the forecast arrivals alone)
    rescue_ms: int = 1500  # > 0: inside a class, a request this close to its deadline goes before the fair order
    # (earliest deadline first among those at risk); works with or without ``enabled`` (``dispatching``)
    deadline_share: float = 0.5  # > 0: hold only slots the lower classes can spare, each one's queued work
    # dispatched before its oldest request has waited this share of its SLA (``headroom_spare``; 0: no bound)


# Headroom as it was before issue 48 made it the default: the fifo/strict/linear presets' baseline.
HEADROOM_OFF = HeadroomPolicy(
    enabled=False,
    hold_ms=8000,
    max_slots=6,
    min_expected=0.5,
    hold_idle=False,
    miss_share=0.0,
    rescue_ms=0,
    deadline_share=0.0,
)


@dataclass(frozen=True)
class DowngradeRule:
    name: str
    condition: str  # source text of the `if:` expression
    action: str  # e.g. "DOWNGRADE_TO_NEAR_RT"
    enabled: bool = True
    order: int = 0

    @property
    def target_class(self) -> str:
        return self.action.removeprefix("DOWNGRADE_TO_")


@dataclass(frozen=True)
class TenantSpec:
    slug: str
    quota_share: float
    name: str = ""
    annual_budget: Decimal | None = None
    classes: tuple[str, ...] = ()  # classes it may declare; empty means all
    vip: bool = False
    active: bool = True


@dataclass(frozen=True)
class BackendSpec:
    name: str
    models: tuple[str, ...]
    slots: int
    url: str = ""
    tpm: int | None = None
    rpm: int | None = None
    input_price_per_1k: Decimal = Decimal("0")
    output_price_per_1k: Decimal = Decimal("0")
    fallback_for: str | None = None
    reserved_slots: int = 0
    enabled: bool = True
    embedding_models: tuple[str, ...] = ()  # those of ``models`` that embed (served at /v1/embeddings only)
    # How the gateway talks to it (scheduling.upstreams); the engine ignores these. Secrets are
    # never here: only the names of the environment variables that hold them.
    api_key_env: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # static extra headers; a value "env:NAME" is read from NAME
    dialect: Dialect = Dialect.OPENAI
    deployment: str | None = None  # azure: the deployment (default: the request's model)
    api_version: str | None = None  # azure: the api-version query parameter


@dataclass(frozen=True)
class SchedulerConfig:
    classes: tuple[ClassSpec, ...]
    aging: AgingPolicy = field(default_factory=AgingPolicy)
    fairness: FairnessPolicy = field(default_factory=FairnessPolicy)
    queue: QueuePolicy = field(default_factory=QueuePolicy)
    headroom: HeadroomPolicy = field(default_factory=HeadroomPolicy)
    downgrade_rules: tuple[DowngradeRule, ...] = ()
    networks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    policy: Policy = Policy.FAIRGATE
    tenants: tuple[TenantSpec, ...] | None = None  # None: section absent
    backends: tuple[BackendSpec, ...] | None = None  # None: section absent

    def class_named(self, name: str) -> ClassSpec | None:
        return next((c for c in self.classes if c.name == name), None)


RequestId = NewType("RequestId", str)
"""The engine's key of a request, unique among the live ones (the gateway's is ``tenant/public id``,
gateway.lifecycle; not the client's own id, which is unique only within its tenant)."""


@dataclass
class Request:
    """A request as the engine sees it. ``cls`` is the effective (post-downgrade) class."""

    id: RequestId
    tenant: str
    cls: str
    model: str
    prompt_tokens: int
    expected_output_tokens: int
    enqueued_ms: int
    deadline_ms: int | None = None  # the client's own deadline, if any (absolute ms)
    vip: bool = False
    job: str | None = None  # the client's job (X-Job-Id, or its key and class): a label, not policy
