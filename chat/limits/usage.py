"""What users used, per UTC day: recording it after each turn, an admin's resets that forgive
a day without deleting it, and the admin's daily chart."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from html import escape

from channels.db import database_sync_to_async
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Sum

from chat.models import Usage, UsageReset

_chart_ids = itertools.count(1)


def today() -> date:
    """The UTC day, like the limiter's token day, so the chart and the quota agree on it."""
    return datetime.now(UTC).date()


def add_usage(
    user_id: int, model: str, tier: str, prompt_tokens: int, completion_tokens: int
) -> None:
    """`record_usage` for code already on the ORM thread."""
    prompt_tokens, completion_tokens = max(0, prompt_tokens), max(0, completion_tokens)
    day = today()
    for _attempt in range(2):
        # Increments in the database: two turns ending together both count (no
        # read-modify-write). One UPDATE needs no transaction of its own; only the day's first
        # turn inserts.
        with connection.cursor() as cursor:
            cursor.execute(
                _increment_sql(),
                (
                    prompt_tokens,
                    completion_tokens,
                    user_id,
                    connection.ops.adapt_datefield_value(day),
                    model,
                    tier,
                ),
            )
            if cursor.rowcount:
                return
        try:
            with transaction.atomic():
                Usage.objects.create(
                    user_id=user_id,
                    day=day,
                    model=model,
                    tier=tier,
                    requests=1,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                )
                return
        except IntegrityError:
            # Another turn created today's row between our update and our create: the
            # savepoint rolled back our insert; the next round's update finds its row.
            continue
    raise RuntimeError(f"could not record usage of user {user_id} on {day}")


_INCREMENT: dict[str, str] = {}


def _increment_sql() -> str:
    """Today's row gets one more request and the turn's tokens: written out once per database
    vendor (it runs at the end of every turn; compiling the F() update took several times what
    the statement takes: docs/decisions/performance.md, issue 18)."""
    sql = _INCREMENT.get(connection.vendor)
    if sql is None:
        q = connection.ops.quote_name
        requests, prompt, completion = q("requests"), q("prompt_tokens"), q("completion_tokens")
        sql = _INCREMENT[connection.vendor] = (
            f"UPDATE {q(Usage._meta.db_table)} SET {requests} = {requests} + 1, "
            f"{prompt} = {prompt} + %s, {completion} = {completion} + %s "
            f"WHERE {q('user_id')} = %s AND {q('day')} = %s AND {q('model')} = %s "
            f"AND {q('tier')} = %s"
        )
    return sql


async def record_usage(
    user_id: int, *, model: str, tier: str, prompt_tokens: int, completion_tokens: int
) -> None:
    """Add one turn to the user's row for today, model and tier (created on first use)."""
    await database_sync_to_async(add_usage)(
        user_id, model, tier, max(0, prompt_tokens), max(0, completion_tokens)
    )


def record_resets(user_ids: list[int], *, by: int | None) -> dict[int, int]:
    """Record an admin's reset of today for these users: each forgives today's Usage history
    not forgiven yet, and the history stays (the charts keep the day). Returns the tokens
    forgiven per user."""
    day = today()
    history = dict(
        Usage.objects.filter(user_id__in=user_ids, day=day)
        .values_list("user_id")
        .annotate(t=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    earlier = dict(
        UsageReset.objects.filter(user_id__in=user_ids, day=day)
        .values_list("user_id")
        .annotate(t=Sum("tokens"))
    )
    forgiven = {
        user_id: max(0, int(history.get(user_id) or 0) - int(earlier.get(user_id) or 0))
        for user_id in user_ids
    }
    UsageReset.objects.bulk_create(
        UsageReset(user_id=user_id, day=day, tokens=tokens, reset_by_id=by)
        for user_id, tokens in forgiven.items()
    )
    return forgiven


def daily_series(user_id: int | None, days: int = 30) -> list[tuple[date, int, int]]:
    """(day, requests, tokens) for the last `days` UTC days, oldest first, zero-filled.

    `user_id` None sums the whole site.
    """
    last = today()
    start = last - timedelta(days=max(1, days) - 1)
    rows = Usage.objects.filter(day__gte=start, day__lte=last)
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    totals = {
        r["day"]: (int(r["requests"] or 0), int(r["tokens"] or 0))
        for r in rows.values("day")
        .order_by("day")
        .annotate(requests=Sum("requests"), tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    }
    series = []
    for offset in range(max(1, days)):
        day = start + timedelta(days=offset)
        requests, tokens = totals.get(day, (0, 0))
        series.append((day, requests, tokens))
    return series


def _short(n: int) -> str:
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(n)


def usage_svg(
    series: list[tuple[date, int, int]], *, width: int = 600, height: int = 160, title: str
) -> str:
    """A bar chart of tokens per day, server-rendered; each bar's tooltip has the numbers."""
    chart_id = f"usage-chart-{next(_chart_ids)}"
    total_tokens = sum(tokens for _, _, tokens in series)
    total_requests = sum(requests for _, requests, _ in series)
    span = f"{series[0][0]:%Y-%m-%d} to {series[-1][0]:%Y-%m-%d}" if series else "no days"
    description = f"Tokens per day, {span}: {total_tokens:,} tokens in {total_requests:,} requests."
    top, bottom, left, right = 22, 20, 44, 8
    plot_w, plot_h = max(1, width - left - right), max(1, height - top - bottom)
    peak = max((tokens for _, _, tokens in series), default=0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" class="usage-chart" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(description)}</desc>',
        f'<text x="{left}" y="14" font-size="12" fill="currentColor">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="currentColor" stroke-opacity="0.4"/>',
        f'<text x="{left - 4}" y="{top + 8}" font-size="10" text-anchor="end" '
        f'fill="currentColor">{_short(peak)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="10" text-anchor="end" '
        'fill="currentColor">0</text>',
    ]
    if series:
        slot = plot_w / len(series)
        bar_w = max(1.0, slot * 0.8)
        for i, (day, requests, tokens) in enumerate(series):
            bar_h = plot_h * tokens / peak if peak else 0
            x = left + i * slot + (slot - bar_w) / 2
            tip = f"{day:%Y-%m-%d}: {tokens:,} tokens, {requests:,} requests"
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - bar_h:.1f}" width="{bar_w:.1f}" '
                f'height="{bar_h:.1f}" fill="#4a7bd0"><title>{escape(tip)}</title></rect>'
            )
        for anchor, x_pos, day in (
            ("start", left, series[0][0]),
            ("end", left + plot_w, series[-1][0]),
        ):
            parts.append(
                f'<text x="{x_pos:.1f}" y="{height - 5}" font-size="10" text-anchor="{anchor}" '
                f'fill="currentColor">{day:%b %d}</text>'
            )
    if not peak:
        parts.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" font-size="12" '
            'text-anchor="middle" fill="currentColor">No usage yet</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
