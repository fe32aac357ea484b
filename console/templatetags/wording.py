"""Template filters of console.wording: ``class_label``, ``sla_minutes``, ``term`` and ``hint``."""

from __future__ import annotations

from django import template

from console import wording

register = template.Library()

register.filter("class_label", wording.class_label)
register.filter("sla_minutes", wording.sla_minutes)


@register.filter
def term(key: str) -> str:
    """A policy term's display name."""
    return wording.TERMS[key][0]


@register.filter
def hint(key: str) -> str:
    """A policy term's one-line explanation (shown on hover)."""
    return wording.TERMS[key][1]


@register.filter
def fairness_label(mode: str) -> str:
    return wording.FAIRNESS_MODES.get(mode, mode)


@register.filter
def aging_label(mode: str) -> str:
    return wording.AGING_MODES.get(mode, mode)


@register.filter
def banner(messages) -> list:
    """The messages for the page's banner: all but those shown beside their form (``at:`` tagged)."""
    return [m for m in messages if not m.extra_tags.startswith("at:")]


@register.inclusion_tag("console/feedback.html")
def feedback_at(feedback: dict, target: str) -> dict:
    """The outcome of the last change made with the form ``target``, where that form is."""
    return {"message": feedback.get(target), "target": target}
