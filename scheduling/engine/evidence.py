"""Prediction's evidence beyond the rates: a class never served, and the part of a horizon the last
minute's evidence covers (``queue.prior_weight``, ``queue.margin_after_ms``).

:class:`Evidence` is a part of :class:`~scheduling.engine.prediction.Prediction`; it reads the
engine's service means and backlog records and keeps no state of its own. The rules and why they
are so: docs/engine.md, "Evidence".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scheduler import Scheduler


class Evidence:
    """The unknown-class service time, the margin-after rule and the turnover count's dispersion."""

    def __init__(self, engine: Scheduler) -> None:
        self.engine = engine

    def unknown_service_ms(self, name: str, now_ms: int) -> float:
        """Admission's service time for a backlog that began before its class completed anything, with
        ``prior_weight`` ``n0`` (docs/engine.md, *unknown class*): the prior over the margin, worth
        ``n0`` completions, blended with the ``n`` measured since; at least the censored mean of the
        backlog's requests (those completed, and those running for as long as they have run)."""
        mean, n0 = self.engine._cls_service.get(name), self.engine._prior_weight
        prior_ms = self.engine._config.queue.service_ms_prior / self.engine._predict_margin
        samples = 0 if mean is None else mean.samples
        planned_ms = (n0 * prior_ms + samples * mean.mean_ms) / (n0 + samples) if mean and samples else prior_ms
        running = self.engine._running_by_cls.get(name, 0)
        done = self.engine._backlog_done.get(name)
        this_backlog = done is not None and done[0] == self.engine._backlog_since.get(name)
        count, total_ms = (done[1], done[2]) if done is not None and this_backlog else (0, 0)
        count += running
        total_ms += running * now_ms - self.engine._started_sum.get(name, 0)
        return max(planned_ms, total_ms / count) if count else planned_ms

    def after_ms(self, cls: str, measured: bool, left_ms: float) -> int:
        """``margin_after_ms`` where it applies (an assumed rate, a horizon of at least the class's own
        service time), else 0: the margin on the whole time to the deadline."""
        after_ms = self.engine._margin_after_ms
        if not after_ms or measured:
            return 0
        mean = self.engine._cls_service.get(cls)
        service_ms = mean.value(self.engine._config.queue.service_ms_prior) if mean is not None else math.inf
        return after_ms if left_ms >= service_ms else 0

    def kept_ms(self, left_ms: float, after_ms: int) -> float:
        """The part of ``left_ms`` to the deadline a predicted wait may take: ``predict_margin`` of it,
        or all of it up to ``after_ms`` (``margin_after_ms`` on an assumed rate, else 0) and the margin
        of the rest."""
        return left_ms - (1.0 - self.engine._predict_margin) * max(0.0, left_ms - after_ms)

    def dispersion(self, cls: str, after_ms: int) -> float:
        """The count's variance over its mean: 1 (Poisson), or within ``after_ms`` the class's measured
        squared coefficient of variation of service (``ServiceMean.dispersion``)."""
        mean = self.engine._cls_service.get(cls) if after_ms else None
        return 1.0 if mean is None else mean.dispersion()
