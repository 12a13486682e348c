"""Template tags for the admin: the site-wide usage chart and feedback per model on the index
page."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Count, F, Q, Sum
from django.utils.safestring import SafeString, mark_safe

from chat.limits.usage import daily_series, usage_svg
from chat.models import Feedback, Usage

register = template.Library()


@register.simple_tag
def site_usage_chart() -> SafeString:
    return mark_safe(
        usage_svg(daily_series(None, 30), title="All users: tokens per day, last 30 days")
    )


@register.simple_tag
def site_usage_by_tier() -> list[dict[str, Any]]:
    rows = (
        Usage.objects.values("tier")
        .annotate(requests=Sum("requests"), tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
        .order_by("tier")
    )
    return [dict(row) for row in rows]


@register.simple_tag
def feedback_by_model() -> list[dict[str, Any]]:
    """👍 and 👎 per model, all time: one grouped query."""
    rows = (
        Feedback.objects.values("message__model")
        .annotate(
            up=Count("pk", filter=Q(vote=Feedback.Vote.UP)),
            down=Count("pk", filter=Q(vote=Feedback.Vote.DOWN)),
        )
        .order_by("message__model")
    )
    return [{"model": r["message__model"], "up": r["up"], "down": r["down"]} for r in rows]
