"""Rate limits in the `limits` notation, and words for the user: "20 messages per minute",
"3 min 5 s", the UTC day a token belongs to."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from limits import RateLimitItem, parse_many


def human_duration(seconds: float) -> str:
    """42 s, 3 min 5 s, 3 h 12 min, 2 d 4 h: the precision a person waiting needs."""
    s = max(1, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        minutes, rest = divmod(s, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if s < 86400:
        hours, rest = divmod(s, 3600)
        minutes = rest // 60
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, rest = divmod(s, 86400)
    hours = rest // 3600
    return f"{days} d {hours} h" if hours else f"{days} d"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def describe_rate(item: RateLimitItem, noun: str = "message") -> str:
    """'20 messages per minute', '3 messages every 2 seconds'."""
    unit = item.GRANULARITY.name
    per = f"per {unit}" if item.multiples == 1 else f"every {item.multiples} {unit}s"
    return f"{_plural(item.amount, noun)} {per}"


@lru_cache(maxsize=256)
def parse_rate(rate: str) -> tuple[RateLimitItem, ...]:
    # Shortest window first: a prompt refused by the minute limit then costs nothing from
    # the day's allowance (a hit that passes stays counted even if a later limit refuses).
    return tuple(sorted(parse_many(rate), key=lambda item: item.get_expiry()))


def utc_day(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


def next_utc_midnight(epoch: float) -> float:
    day = datetime.fromtimestamp(epoch, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day + timedelta(days=1)).timestamp()


def limits_storage_uri(redis_url: str) -> str:
    """The `limits` library's URI for our REDIS_URL: it picks its async storages by scheme
    (`async+redis://`, not `redis://`)."""
    if redis_url.startswith("unix://"):
        return "async+redis+unix://" + redis_url.removeprefix("unix://")
    return "async+" + redis_url
