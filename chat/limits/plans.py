"""The limits in force for a user: their Quota, else its plan, else the default plan, else the
CHAT_* settings; cached for a moment per process."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection

from chat.limits.rates import parse_rate
from chat.models import Plan, Quota

logger = logging.getLogger("chat.limits")

LIMITS_CACHE_SECONDS = 2.0


@dataclass(frozen=True)
class UserLimits:
    """The limits in force for one user, resolved Quota → its plan → default plan → settings."""

    rate: str
    daily_tokens: int  # 0 = unlimited
    max_streams: int
    plan: str
    allow_full_on_mobile: bool
    # Whether the full model may answer at all (Plan.full_model_allowed), whatever the device.
    full_model: bool = True


# --- resolving a user's limits ------------------------------------------------------------

_limits_cache: dict[int, tuple[float, UserLimits]] = {}


def _valid_rate(rate: str) -> bool:
    try:
        return bool(parse_rate(rate))
    except ValueError:
        return False


def default_plan() -> Plan | None:
    return Plan.objects.filter(is_default=True).order_by("id").first()


def resolve_limits(user_id: int) -> UserLimits:
    """The user's limits straight from the database (sync, uncached): two queries, the user's
    Quota and, in one, its plan and the default plan.

    Written out once per database vendor (through raw(), so fields convert as usual): this
    runs at a user's first prompt and again once the 2 s cache ran out, so at nearly every
    turn of a busy site, and compiling `select_related().filter().first()` plus the default
    plan's query took several times what the statements take (docs/decisions/performance.md).
    """
    quota_sql, plans_sql = _limits_sql()
    quota = next(iter(Quota.objects.raw(quota_sql, [user_id])), None)
    plan_id = quota.plan_id if quota is not None else None
    plans = list(Plan.objects.raw(plans_sql, [True, plan_id]))
    default = next((p for p in plans if p.is_default), None)
    if quota is not None:
        # The plan as select_related would have loaded it (None if it has none).
        quota.plan = next((p for p in plans if p.pk == plan_id), None)
    return limits_of(quota, default)


_LIMITS_SQL: dict[str, tuple[str, str]] = {}


def _limits_sql() -> tuple[str, str]:
    sql = _LIMITS_SQL.get(connection.vendor)
    if sql is None:
        q = connection.ops.quote_name

        def columns(model: type[Quota] | type[Plan]) -> str:
            return ", ".join(q(f.column or f.name) for f in model._meta.concrete_fields)

        quota, plan = Quota._meta, Plan._meta
        sql = _LIMITS_SQL[connection.vendor] = (
            f"SELECT {columns(Quota)} FROM {q(quota.db_table)} WHERE {q('user_id')} = %s",
            f"SELECT {columns(Plan)} FROM {q(plan.db_table)} "
            f"WHERE {q('is_default')} = %s OR {q('id')} = %s ORDER BY {q('id')}",
        )
    return sql


def limits_of(quota: Quota | None, default: Plan | None) -> UserLimits:
    """The limits from a user's Quota (its plan loaded) and the default plan; no query.

    The admin's user list loads both once for a whole page and calls this per row.
    """
    plan = (quota.plan if quota else None) or default
    layers: list[Quota | Plan] = [x for x in (quota, plan, default) if x is not None]

    rate = settings.CHAT_RATE_LIMIT
    for layer in layers:
        if layer.rate_limit.strip():
            if _valid_rate(layer.rate_limit):
                rate = layer.rate_limit.strip()
                break
            # An admin typo must not lock the user out or lift their limit: skip the layer.
            logger.warning("ignoring invalid rate limit %r on %r", layer.rate_limit, layer)

    return UserLimits(
        rate=rate,
        daily_tokens=_first("daily_tokens", layers, settings.CHAT_DAILY_TOKENS),
        max_streams=_first("max_concurrent_streams", layers, settings.CHAT_MAX_CONCURRENT_STREAMS),
        plan=plan.name if plan else "default",
        allow_full_on_mobile=plan.allow_full_on_mobile if plan else False,
        full_model=plan.full_model_allowed if plan else True,
    )


def _first(field: str, layers: list[Quota | Plan], fallback: int) -> int:
    for layer in layers:
        value = getattr(layer, field)
        if value is not None:
            return int(value)
    return fallback


def daily_tokens_of(quota: Quota | None, default_daily_tokens: int | None) -> int:
    """The daily quota from a Quota (its plan loaded) and the default plan's daily tokens.

    The admin's user list annotates the default plan's value onto every row, so a page of
    users costs no query per row.
    """
    for value in (
        quota.daily_tokens if quota else None,
        quota.plan.daily_tokens if quota and quota.plan else None,
        default_daily_tokens,
    ):
        if value is not None:
            return int(value)
    return int(settings.CHAT_DAILY_TOKENS)


async def limits_for(user_id: int) -> UserLimits:
    """The user's limits; cached ~2 s in this process, dropped at once when an admin edits."""
    now = time.monotonic()
    cached = _limits_cache.get(user_id)
    if cached and cached[0] > now:
        return cached[1]
    resolved: UserLimits = await database_sync_to_async(resolve_limits)(user_id)
    _limits_cache[user_id] = (now + LIMITS_CACHE_SECONDS, resolved)
    return resolved


def forget_cached_limits() -> None:
    """Drop every cached resolution (an admin edited a plan or quota; settings changed)."""
    _limits_cache.clear()
