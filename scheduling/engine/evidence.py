"""What prediction knows of a class beyond its rates: a class never served, and the part of a horizon
the last minute's evidence covers (``PredictMixin`` reads these; rules below).

**Unknown class** (``queue.prior_weight``: ``n0``; 0, the default, is off). A backlog that begins
before its class has completed anything (a burst onto a class never served) is predicted from
``service_ms_prior``, which nothing has checked; and the first completions of such a burst are its
shortest requests (the long ones still run: the sample is censored), so the measured mean starts
low. With ``n0 > 0`` the assumed rate of such a backlog, until it ends, uses

    s = max((n0 x prior / m + n x mean) / (n0 + n), censored)

``prior / m``: the prior with the margin on it (the uncertain part of the prediction, before the
first admission), worth ``n0`` completions (about the pool's slots: the completions of a burst's
first round are biased short until the round is done); ``n``, ``mean``: the class's completions
and their mean; ``censored``: (the service times of the backlog's completions + how long each of
the class's running requests has run) / their count, a lower bound on their mean that rises as soon
as requests run longer than assumed (a request running for 22 s says the mean is not 20 s), O(1)
from the sum of start times. A class with completions before its backlog keeps prediction's rule
(the slower of its mean now and at the backlog's first prediction).

**Margin after** (``queue.margin_after_ms``: ``A``; 0, the default, is off). The margin guards
against what the evidence cannot tell: a higher class rising, a service time drifting, other
tenants' later requests overtaking under fair sharing. On a backlog that has just begun (the
assumed rate: no request of the class waited a minute ago, so no later arrival of it has been
seen to overtake) the rate rests on the slots, the higher classes' last minute and the measured
service times, which hold for the next ``A`` ms (the rates' own window, 60 s); so there, on a
horizon of at least the class's own service time (its own slots cycle within it; a shorter one waits
on slots other classes hold, and keeps the margin), a predicted wait may take all of the time to the
deadline up to ``A`` and ``m`` of the rest, ``kept = left - (1 - m) x max(0, left - A)`` (in
place of ``m x left`` in prediction's admission rules), and within ``A`` the count of turnovers is
judged as a chance (prediction's *chance*, whatever the service time).
When the horizon is at least the class's own service time, the slots it fills turn over at its own
pace, and their count is a renewal count: variance ``mean x c2``, ``c2`` the squared coefficient of
variation of the class's service times (measured, an exponentially weighted variance beside the
mean, after 40 completions; else 1, which is Poisson), normal with a continuity correction; on a
shorter horizon the turnovers are of slots other classes hold, and Poisson stays. A NEAR_RT burst
that fills 87 % of its 15 s SLA on an idle pool is admitted; a 30-minute BATCH horizon keeps the
margin on 97 % of it. The slack a tenant's share may use is ``left - kept``:
within ``A`` none, so there a tenant is admitted only as the class fits. A class backlogged for a
window (a measured rate) keeps ``m x left``: there the margin is what keeps room for the other
tenants' later requests (without it, ``small-tenant``'s NEAR_RT, overloaded for an hour, had 241
timeouts instead of 111; with it, 118). Its price elsewhere: ``aging-storm`` with prediction had 89
timeouts instead of 72 (NEAR_RT 33 instead of 20; both with fast_fail off).
"""

from __future__ import annotations

import math

from . import admission as adm
from .model import SchedulerConfig


class EvidenceMixin:
    """Needs the attributes that :class:`Scheduler` sets up (declared here for the type checker)."""

    _cls_service: dict[str, adm.ServiceMean]
    _config: SchedulerConfig
    _predict_margin: float
    _prior_weight: int
    _margin_after_ms: int
    _backlog_since: dict[str, float]
    _backlog_done: dict[str, tuple[float, int, int]]
    _running_by_cls: dict[str, int]
    _started_sum: dict[str, int]

    def _unknown_service_ms(self, name: str, now_ms: int) -> float:
        """Admission's service time for a backlog that began before its class completed anything, with
        ``prior_weight`` ``n0`` (module docstring, *unknown class*): the prior over the margin, worth
        ``n0`` completions, blended with the ``n`` measured since; at least the censored mean of the
        backlog's requests (those completed, and those running for as long as they have run)."""
        mean, n0 = self._cls_service.get(name), self._prior_weight
        prior_ms = self._config.queue.service_ms_prior / self._predict_margin
        samples = 0 if mean is None else mean.samples
        planned_ms = (n0 * prior_ms + samples * mean.mean_ms) / (n0 + samples) if mean and samples else prior_ms
        running = self._running_by_cls.get(name, 0)
        done = self._backlog_done.get(name)
        this_backlog = done is not None and done[0] == self._backlog_since.get(name)
        count, total_ms = (done[1], done[2]) if done is not None and this_backlog else (0, 0)
        count += running
        total_ms += running * now_ms - self._started_sum.get(name, 0)
        return max(planned_ms, total_ms / count) if count else planned_ms

    def _after_ms(self, cls: str, measured: bool, left_ms: float) -> int:
        """``margin_after_ms`` where it applies (an assumed rate, a horizon of at least the class's own
        service time), else 0: the margin on the whole time to the deadline."""
        after_ms = self._margin_after_ms
        if not after_ms or measured:
            return 0
        mean = self._cls_service.get(cls)
        service_ms = mean.value(self._config.queue.service_ms_prior) if mean is not None else math.inf
        return after_ms if left_ms >= service_ms else 0

    def _kept_ms(self, left_ms: float, after_ms: int) -> float:
        """The part of ``left_ms`` to the deadline a predicted wait may take: ``predict_margin`` of it,
        or all of it up to ``after_ms`` (``margin_after_ms`` on an assumed rate, else 0) and the margin
        of the rest."""
        return left_ms - (1.0 - self._predict_margin) * max(0.0, left_ms - after_ms)

    def _dispersion(self, cls: str, after_ms: int) -> float:
        """The count's variance over its mean: 1 (Poisson), or within ``after_ms`` the class's measured
        squared coefficient of variation of service (``ServiceMean.dispersion``)."""
        mean = self._cls_service.get(cls) if after_ms else None
        return 1.0 if mean is None else mean.dispersion()
