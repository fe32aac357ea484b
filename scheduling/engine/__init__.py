"""Fairgate's scheduling engine: plain Python, no framework, no clock (``now_ms`` is passed in).

Public API: :class:`Scheduler` with :class:`Admission`, :class:`Grant`, :class:`QueuePosition`,
the value objects of :mod:`scheduling.engine.model`, :func:`apply_policy` (named presets) and
the storage interface (:class:`SchedulerStore`, :class:`MemoryStore`).
"""

from .counters import WAIT_BUCKETS_MS, Counters, Tally
from .model import (
    AgingPolicy,
    AgingSegment,
    BackendSpec,
    Boost,
    ClassSpec,
    FairnessMode,
    FairnessPolicy,
    Policy,
    QueuePolicy,
    Request,
    SchedulerConfig,
    TenantSpec,
)
from .outcomes import Admission, Grant, QueuePosition
from .presets import apply_policy
from .scheduler import Scheduler
from .store import MemoryStore, SchedulerStore

__all__ = [
    "AgingPolicy",
    "AgingSegment",
    "Admission",
    "BackendSpec",
    "Boost",
    "ClassSpec",
    "Counters",
    "FairnessMode",
    "FairnessPolicy",
    "Grant",
    "MemoryStore",
    "Policy",
    "QueuePolicy",
    "QueuePosition",
    "Request",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStore",
    "Tally",
    "TenantSpec",
    "WAIT_BUCKETS_MS",
    "apply_policy",
]
