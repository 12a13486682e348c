"""Template tags for the admin: the site-wide usage chart on the index page."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import F, Sum
from django.utils.safestring import SafeString, mark_safe

from chat.models import Usage
from chat.usage import daily_series, usage_svg

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
