import pytest

from scheduling.engine.aging import AgingCurve
from scheduling.engine.model import AgingPolicy, AgingSegment, Boost
from tests.unit.engine.engine_helpers import REPORT_SEGMENTS

CURVE = AgingCurve(AgingPolicy("piecewise", REPORT_SEGMENTS))


def formula(r: float) -> float:
    if r < 0.5:
        return 0.0
    if r < 0.8:
        return 1.0 * (r - 0.5) / 0.3
    return 1.0 + 2.2 * ((r - 0.8) / 0.15) ** 2


@pytest.mark.parametrize("ratio", [0.0, 0.2, 0.4999, 0.5, 0.6, 0.65, 0.7999, 0.8, 0.85, 0.9, 0.9499])
def test_boost_matches_issue_formula(ratio):
    assert CURVE.boost(ratio) == pytest.approx(formula(ratio))


def test_segment_bounds_exact_values():
    assert CURVE.boost(0.5) == 0.0
    assert CURVE.boost(0.8) == pytest.approx(1.0)
    assert CURVE.boost(0.95 - 1e-12) == pytest.approx(3.2)


@pytest.mark.parametrize("bound", [0.5, 0.8])
def test_continuous_at_bounds(bound):
    eps = 1e-9
    assert CURVE.boost(bound - eps) == pytest.approx(CURVE.boost(bound + eps), abs=1e-6)


def test_rising():
    values = [CURVE.boost(i / 1000) for i in range(950)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert values[-1] > values[600] > values[0] == 0.0


def test_preempt_at_a3_only():
    assert not CURVE.preempts(0.9499)
    assert CURVE.preempts(0.95)
    assert CURVE.preempts(3.0)
    assert CURVE.preempt_at_ms(1000, 3000) == 1000 + 2850
    assert CURVE.preempt_at_ms(0, 7) == 7  # ceil(6.65)


def test_linear_mode_is_ratio_without_preempt():
    curve = AgingCurve(AgingPolicy("linear"))
    assert curve.boost(0.0) == 0.0
    assert curve.boost(0.73) == pytest.approx(0.73)
    assert curve.boost(2.0) == pytest.approx(2.0)
    assert curve.preempt_ratio is None and not curve.preempts(5.0)


def test_none_mode():
    curve = AgingCurve(AgingPolicy("none", REPORT_SEGMENTS))
    assert curve.boost(0.99) == 0.0 and curve.preempt_ratio is None and not curve.active


def test_gap_between_segments_keeps_value_and_open_linear_rises():
    curve = AgingCurve(
        AgingPolicy(
            "piecewise",
            (
                AgingSegment(0.2, 0.4, Boost.LINEAR, 2.0),
                AgingSegment(0.6, None, Boost.LINEAR, 1.0),
            ),
        )
    )
    assert curve.boost(0.3) == pytest.approx(1.0)
    assert curve.boost(0.5) == pytest.approx(2.0)
    assert curve.boost(1.6) == pytest.approx(3.0)
    assert curve.preempt_ratio is None


def test_unknown_mode_rejected():
    with pytest.raises(ValueError):
        AgingCurve(AgingPolicy("exponential"))
