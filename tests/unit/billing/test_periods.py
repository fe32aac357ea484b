"""Fiscal periods contain their instant, for any start month and zone (property test)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.periods import month_period_at, period_key, year_period, year_period_at


@hsettings(max_examples=300, deadline=None)
@given(
    at=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    start_month=st.integers(1, 12),
    zone=st.sampled_from(["UTC", "Asia/Shanghai", "America/New_York", "Pacific/Kiritimati"]),
)
def test_periods_contain_their_instant(at, start_month, zone):
    with override_settings(FAIRGATE_FISCAL_YEAR_START_MONTH=start_month, FAIRGATE_FISCAL_TZ=zone):
        year, month = year_period_at(at), month_period_at(at)
        assert year.starts_at <= at < year.ends_at
        assert month.starts_at <= at < month.ends_at
        assert year.starts_at <= month.starts_at and month.ends_at <= year.ends_at
        assert year_period(year.fiscal_year + 1).starts_at == year.ends_at


@pytest.mark.parametrize(
    "start_month, at, fiscal_year",
    [
        (1, datetime(2025, 1, 1, tzinfo=UTC), 2025),
        (4, datetime(2025, 3, 31, 23, 59, tzinfo=UTC), 2024),
        (4, datetime(2025, 4, 1, tzinfo=UTC), 2025),
        (10, datetime(2025, 12, 31, tzinfo=UTC), 2025),
    ],
)
def test_fiscal_year_label_is_the_start_year(start_month, at, fiscal_year):
    with override_settings(FAIRGATE_FISCAL_YEAR_START_MONTH=start_month, FAIRGATE_FISCAL_TZ="UTC"):
        assert year_period_at(at).fiscal_year == fiscal_year


@hsettings(max_examples=200, deadline=None)
@given(
    instants=st.lists(
        st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
        min_size=1,
        max_size=6,
    ),
    start_month=st.integers(1, 12),
    zone=st.sampled_from(["UTC", "Asia/Shanghai", "America/New_York", "Pacific/Kiritimati"]),
)
def test_period_key_names_the_fiscal_month_whatever_was_asked_before(instants, start_month, zone):
    """period_key remembers the last month asked for: any sequence of instants (and of settings)
    gets each instant's own month, as month_period_at computes it."""
    with override_settings(FAIRGATE_FISCAL_YEAR_START_MONTH=start_month, FAIRGATE_FISCAL_TZ=zone):
        for at in instants:
            assert period_key(at) == (zone, start_month, month_period_at(at).starts_at)
