"""Template filters for the console's money and durations (console.formatting)."""

from __future__ import annotations

from django import template
from django.conf import settings

from console.formatting import duration_text, ended_because, money_text

register = template.Library()


@register.filter
def money(amount, currency=None) -> str:
    return money_text(amount, currency or None)


@register.filter
def duration(ms) -> str:
    return duration_text(ms)


@register.filter
def because(code) -> str:
    return ended_because(code)


@register.simple_tag
def currency() -> str:
    """The configured currency (the browser's format.js reads it from the page's body)."""
    return settings.FAIRGATE_CURRENCY
