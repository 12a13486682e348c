"""Why a turn or a request was refused, in words for the user, and when they can come back."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

from limits import RateLimitItem

from chat.limits.rates import describe_rate, human_duration, next_utc_midnight

RejectionCode = Literal["rate_limited", "quota_exceeded", "too_many_streams"]

UNAVAILABLE_RETRY_AFTER = 5
# What a refusal at the stream cap waits for: an answer to end, not a time. The contract gives
# every limited prompt a `retry_after`; here it is the least wait (an answer may end any moment),
# and `retry_when` tells a page not to count down to it.
WHEN_A_STREAM_ENDS = "stream_ends"
STREAM_RETRY_AFTER = 1


@dataclass(frozen=True)
class Rejection:
    """Why a prompt or request was refused, and when to come back: after `retry_after`
    seconds (at `reset_at`), or — at the stream cap — when one of the user's answers ends
    (`retry_when`; no clock can promise when that is)."""

    code: RejectionCode
    message: str
    retry_after: int | None  # seconds, >= 1
    reset_at: float | None  # epoch seconds
    retry_when: str | None = None


def rate(item: RateLimitItem, noun: str, reset_time: float, remaining: int) -> Rejection:
    """Over a request rate: the limit in words and the exact moment a hit frees."""
    now = time.time()
    # The window may have moved on between the hit and the stats: then it is free now.
    reset_at = reset_time if remaining <= 0 else now + 1
    retry_after = max(1, math.ceil(reset_at - now))
    return Rejection(
        code="rate_limited",
        message=(
            f"You can send {describe_rate(item, noun)}. Try again in {human_duration(retry_after)}."
        ),
        retry_after=retry_after,
        reset_at=max(reset_at, now + 1),
    )


def _worded(
    item: RateLimitItem, noun: str, reset_time: float, remaining: int, words: str
) -> Rejection:
    """`rate`'s wait with other words: `words` is formatted with `limit` (the rate in words)
    and `wait` (how long until a hit frees)."""
    over = rate(item, noun, reset_time, remaining)
    wait = human_duration(over.retry_after or 1)
    return Rejection(
        code=over.code,
        message=words.format(limit=describe_rate(item, noun), wait=wait),
        retry_after=over.retry_after,
        reset_at=over.reset_at,
    )


def resumes(item: RateLimitItem, noun: str, reset_time: float, remaining: int) -> Rejection:
    """Over CHAT_RESUME_RATE: the page asks for the answer again by itself after
    `retry_after`, so the words say that instead of asking the user to try again."""
    words = (
        "Answers were reloaded too often (at most {limit}). This one goes on by itself in "
        "{wait}; nothing is lost."
    )
    return _worded(item, noun, reset_time, remaining, words)


def reconnects(item: RateLimitItem, noun: str, reset_time: float, remaining: int) -> Rejection:
    """Over CHAT_SOCKET_RATE: the tab connects again by itself after `retry_after`."""
    words = (
        "Your tabs connected too often (at most {limit}). This tab connects again by itself "
        "in {wait}; nothing is lost."
    )
    return _worded(item, noun, reset_time, remaining, words)


def pages(item: RateLimitItem, noun: str, reset_time: float, remaining: int) -> Rejection:
    """Over CHAT_PAGE_RATE: conversation pages were loaded too often."""
    words = "Conversations were opened too often (at most {limit}). Try again in {wait}."
    return _worded(item, noun, reset_time, remaining, words)


def streams(cap: int) -> Rejection:
    """At the cap of concurrent streams: the wait lasts until an answer ends."""
    if cap <= 0:
        message = "Your plan does not allow answers to stream right now."
    elif cap == 1:
        message = (
            "You already have an answer streaming. You can send this when it ends, "
            "or stop it first."
        )
    else:
        message = (
            f"You already have {cap} answers streaming. You can send this when one of "
            "them ends, or stop one first."
        )
    return Rejection(
        code="too_many_streams",
        message=message,
        retry_after=STREAM_RETRY_AFTER,
        reset_at=None,
        retry_when=WHEN_A_STREAM_ENDS,
    )


def _until_midnight() -> tuple[float, int]:
    now = time.time()
    reset_at = next_utc_midnight(now)
    return reset_at, max(1, math.ceil(reset_at - now))


def tokens(quota: int, left: int, needed: int) -> Rejection:
    """(Almost) nothing left of the user's daily quota: how much, and when it resets."""
    reset_at, retry_after = _until_midnight()
    if left <= 0:
        said = f"You have used today's {quota:,} tokens."
    else:
        said = (
            f"Only {left:,} of today's {quota:,} tokens are left: too few for this message "
            f"and an answer (it needs at least {needed:,})."
        )
    resets = f"The quota resets at 00:00 UTC (in {human_duration(retry_after)})."
    return Rejection(
        code="quota_exceeded",
        message=f"{said} {resets}",
        retry_after=retry_after,
        reset_at=reset_at,
    )


def budget() -> Rejection:
    """The site's daily token budget (CHAT_GLOBAL_DAILY_TOKENS) is spent, for everyone."""
    reset_at, retry_after = _until_midnight()
    return Rejection(
        code="quota_exceeded",
        message=(
            "The service has used up today's tokens for everyone, so new messages are "
            f"paused until 00:00 UTC (in {human_duration(retry_after)}). "
            "This is not a limit of your account."
        ),
        retry_after=retry_after,
        reset_at=reset_at,
    )


def unavailable() -> Rejection:
    """The limiter's storage is down and the policy is `closed`."""
    return Rejection(
        code="rate_limited",
        message=(
            "Usage limits are temporarily unavailable, so new messages are paused. "
            f"Try again in {human_duration(UNAVAILABLE_RETRY_AFTER)}."
        ),
        retry_after=UNAVAILABLE_RETRY_AFTER,
        reset_at=time.time() + UNAVAILABLE_RETRY_AFTER,
    )
