"""Piecewise aging: how many class levels a request's wait is worth, and when it preempts.

The boost is a function of ``wait_ratio = waited_ms / sla_ms`` built from ordered segments (none,
linear, quadratic, preempt); modes ``piecewise``, ``linear`` (boost = wait ratio) and ``none``. The
curve and its generalisation: docs/engine.md, "Aging".
"""

from __future__ import annotations

import math

from .model import AgingPolicy, Boost

_LINEAR, _QUADRATIC, _FLAT = 1, 2, 0


class AgingCurve:
    """A compiled :class:`AgingPolicy`; ``boost`` costs a scan of at most a handful of segments."""

    __slots__ = ("mode", "preempt_ratio", "_segments", "no_boost_below")

    def __init__(self, policy: AgingPolicy) -> None:
        self.mode = policy.mode
        self.preempt_ratio: float | None = None
        self._segments: tuple[tuple[float, float | None, int, float, float], ...] = ()
        self.no_boost_below = math.inf  # wait ratios below this get no boost (most requests, most of the time)
        if policy.mode == "piecewise":
            self._compile(policy)
        elif policy.mode == "linear":
            self.no_boost_below = 0.0
        elif policy.mode != "none":
            raise ValueError(f"unknown aging mode {policy.mode!r}")

    def _compile(self, policy: AgingPolicy) -> None:
        compiled = []
        base = 0.0
        for seg in sorted(policy.segments, key=lambda s: s.lo):
            if seg.boost is Boost.PREEMPT:
                self.preempt_ratio = seg.lo
                break  # nothing above preempt matters
            shape = {Boost.LINEAR: _LINEAR, Boost.QUADRATIC: _QUADRATIC}.get(seg.boost, _FLAT)
            compiled.append((seg.lo, seg.hi, shape, seg.k, base))
            if shape != _FLAT and seg.hi is not None:
                base += seg.k
        self._segments = tuple(compiled)
        self.no_boost_below = min((lo for lo, _, shape, _, _ in compiled if shape != _FLAT), default=math.inf)

    @property
    def active(self) -> bool:
        """True when waiting can ever change a request's standing."""
        return self.mode == "linear" or bool(self._segments) or self.preempt_ratio is not None

    def boost(self, wait_ratio: float) -> float:
        """Boost in class levels for ``wait_ratio`` (ignores preempt: see :meth:`preempts`)."""
        if wait_ratio < self.no_boost_below:
            return 0.0
        if self.mode == "linear":
            return wait_ratio
        value = 0.0
        for lo, hi, shape, k, base in self._segments:
            if wait_ratio < lo:
                break
            if hi is not None and wait_ratio >= hi:
                value = base + (k if shape != _FLAT else 0.0)
                continue
            if shape == _FLAT:
                return base
            x = (wait_ratio - lo) / (hi - lo) if hi is not None else wait_ratio - lo
            return base + k * (x if shape == _LINEAR else x * x)
        return value

    def no_boost_until_ms(self, enqueued_ms: int, sla_ms: int) -> float:
        """First integer ms at which the wait ratio reaches :attr:`no_boost_below` (inf: never).

        Before it :meth:`boost` is 0. Found from the float product, then corrected by evaluating
        the ratio exactly as callers do, so it never disagrees with ``boost`` by a rounding.
        """
        threshold = self.no_boost_below
        if threshold == math.inf:
            return math.inf
        at_ms = enqueued_ms + math.ceil(threshold * sla_ms)
        while (at_ms - 1 - enqueued_ms) / sla_ms >= threshold:
            at_ms -= 1
        while (at_ms - enqueued_ms) / sla_ms < threshold:
            at_ms += 1
        return at_ms

    def outranks_at(self, levels: float) -> float | None:
        """First wait ratio (at most 1, a whole SLA) at which a request outranks a class ``levels``
        levels above its own (boost above ``levels``), or is at preempt if that comes first; None when
        neither happens within its SLA. The boost rises with the ratio, so a bisection finds it."""
        if levels <= 0:
            return 0.0
        limit = 1.0 if self.preempt_ratio is None else min(1.0, self.preempt_ratio)
        if self.boost(limit) <= levels:
            return self.preempt_ratio if self.preempt_ratio is not None and self.preempt_ratio <= 1.0 else None
        lo, hi = 0.0, limit  # boost(lo) <= levels < boost(hi)
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.boost(mid) <= levels else (lo, mid)
        return hi

    def preempts(self, wait_ratio: float) -> bool:
        return self.preempt_ratio is not None and wait_ratio >= self.preempt_ratio

    def preempt_wait_ms(self, sla_ms: int) -> float | None:
        """Wait after which a request of a class with ``sla_ms`` is at preempt (None: never)."""
        if self.preempt_ratio is None:
            return None
        return self.preempt_ratio * sla_ms

    def preempt_at_ms(self, enqueued_ms: int, sla_ms: int) -> int | None:
        """First integer ms at which a request enqueued at ``enqueued_ms`` is at preempt."""
        wait = self.preempt_wait_ms(sla_ms)
        return None if wait is None else enqueued_ms + math.ceil(wait)
