"""Money helpers: 6 decimal places, ROUND_HALF_UP, and an exact SUM on SQLite too.

PostgreSQL keeps NUMERIC exactly. SQLite stores decimals as binary floats, which is exact enough
for one 6-place amount below 10^9 (Django quantizes on read) but not for a SUM of many: `MoneySum`
sums whole micro-units there instead, so reports and `ledger verify` agree with the ledger.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Sum

MICRO = Decimal("0.000001")
ZERO = Decimal("0")


def money(value: Decimal) -> Decimal:
    return value.quantize(MICRO, rounding=ROUND_HALF_UP)


class MoneySum(Sum):
    """SUM of a 6-place money column (no filter=/distinct= support: group or filter the queryset)."""

    def as_sqlite(self, compiler, connection, **extra_context):
        template = "(SUM(ROUND(%(expressions)s * 1000000)) / 1000000.0)"
        return self.as_sql(compiler, connection, template=template, **extra_context)


def or_zero(value: Decimal | None) -> Decimal:
    return ZERO if value is None else money(value)
