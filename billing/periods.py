"""Fiscal periods: years starting on FAIRGATE_FISCAL_YEAR_START_MONTH, in FAIRGATE_FISCAL_TZ.

A fiscal year is labelled by the calendar year in which it starts (start month 4: FY2025 runs
from 1 April 2025 to 1 April 2026, end exclusive). Boundaries are aware datetimes at local midnight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from django.conf import settings


@dataclass(frozen=True)
class Period:
    fiscal_year: int
    starts_at: datetime
    ends_at: datetime  # exclusive


def fiscal_tz() -> ZoneInfo:
    return ZoneInfo(settings.FAIRGATE_FISCAL_TZ)


def _start_month() -> int:
    return int(settings.FAIRGATE_FISCAL_YEAR_START_MONTH)


def _add_months(year: int, month: int, months: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + months
    return index // 12, index % 12 + 1


def fiscal_year_of(at: datetime) -> int:
    local = at.astimezone(fiscal_tz())
    return local.year if local.month >= _start_month() else local.year - 1


def year_period(fiscal_year: int) -> Period:
    tz = fiscal_tz()
    start_month = _start_month()
    end_year, end_month = _add_months(fiscal_year, start_month, 12)
    return Period(
        fiscal_year=fiscal_year,
        starts_at=datetime(fiscal_year, start_month, 1, tzinfo=tz),
        ends_at=datetime(end_year, end_month, 1, tzinfo=tz),
    )


def year_period_at(at: datetime) -> Period:
    return year_period(fiscal_year_of(at))


def month_period_at(at: datetime) -> Period:
    tz = fiscal_tz()
    local = at.astimezone(tz)
    next_year, next_month = _add_months(local.year, local.month, 1)
    return Period(
        fiscal_year=fiscal_year_of(at),
        starts_at=datetime(local.year, local.month, 1, tzinfo=tz),
        ends_at=datetime(next_year, next_month, 1, tzinfo=tz),
    )


def period_key(at: datetime) -> tuple:
    """What names `at`'s fiscal month and year under the current settings, cheaply: the month's
    start is memoised per minute (no time zone's offset has a finer step, so a minute never
    straddles a local midnight)."""
    tz_name, start_month = settings.FAIRGATE_FISCAL_TZ, _start_month()
    return tz_name, start_month, _month_start(at.replace(second=0, microsecond=0), tz_name)


@functools.lru_cache(maxsize=1024)
def _month_start(minute: datetime, tz_name: str) -> datetime:
    """`tz_name` (the setting month_period_at reads) is part of the memo's key."""
    return month_period_at(minute).starts_at
