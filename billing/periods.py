"""Fiscal periods: years starting on FAIRGATE_FISCAL_YEAR_START_MONTH, in FAIRGATE_FISCAL_TZ.

A fiscal year is labelled by the calendar year in which it starts (start month 4: FY2025 runs
from 1 April 2025 to 1 April 2026, end exclusive). Boundaries are aware datetimes at local midnight.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.signals import setting_changed


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
    """What names `at`'s fiscal month and year under the current settings, cheaply: the month
    last asked for is remembered with its bounds (and forgotten when a fiscal setting changes)."""
    global _last_month
    last = _last_month
    if last is not None and at.tzinfo is not None and last[0] <= at < last[1]:
        return last[2]
    month = month_period_at(at)
    key = (settings.FAIRGATE_FISCAL_TZ, _start_month(), month.starts_at)
    _last_month = (month.starts_at, month.ends_at, key)
    return key


_last_month: tuple[datetime, datetime, tuple] | None = None  # (from, until, period_key) of one month


def _fiscal_setting_changed(*, setting: str, **_) -> None:
    global _last_month
    if setting in ("FAIRGATE_FISCAL_TZ", "FAIRGATE_FISCAL_YEAR_START_MONTH"):
        _last_month = None


setting_changed.connect(_fiscal_setting_changed)
