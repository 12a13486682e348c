"""The limiter: exact request rates, token reservations, stream slots, failure policy, plans.

Every behaviour runs on both backends: the real Redis at 127.0.0.1:6379 (a unique key prefix
per test, deleted afterwards) and the in-process memory backend.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from django.test import override_settings

from chat import metrics
from chat.limits.limiter import Admission, Limiter, Rejection, get_limiter
from chat.limits.plans import UserLimits, limits_for
from chat.limits.rates import describe_rate, human_duration, parse_rate
from chat.models import Plan, Quota

REDIS_URL = "redis://127.0.0.1:6379/0"
# Port 1 refuses connections: a real "Redis is down", not a mock.
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"
ROOT = Path(__file__).resolve().parent.parent

MakeLimiter = Callable[..., Limiter]


def fixed_limits(
    rate: str = "1000/minute", daily_tokens: int = 0, max_streams: int = 1000
) -> Callable[[int], Awaitable[UserLimits]]:
    """A limits resolver without the database, so a test states exactly the limits it needs."""
    limits = UserLimits(
        rate=rate,
        daily_tokens=daily_tokens,
        max_streams=max_streams,
        plan="test",
        allow_full_on_mobile=False,
    )

    async def resolve(user_id: int) -> UserLimits:
        return limits

    return resolve


def delete_keys(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"test:ratelimit:{uuid.uuid4().hex}:"
    yield prefix
    delete_keys(prefix)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def make_limiter(request: pytest.FixtureRequest) -> AsyncIterator[MakeLimiter]:
    """Build limiters on one backend that share one key prefix (like instances of one site)."""
    prefix = f"test:ratelimit:{uuid.uuid4().hex}:"
    url = REDIS_URL if request.param == "redis" else ""
    made: list[Limiter] = []
    shared_memory: dict[str, Limiter] = {}

    def make(
        rate: str = "1000/minute",
        daily_tokens: int = 0,
        max_streams: int = 1000,
        **kwargs: Any,
    ) -> Limiter:
        # "closed": a Redis hiccup then fails the test loudly instead of admitting silently.
        kwargs.setdefault("failure", "closed")
        limiter = Limiter(
            url,
            prefix=prefix,
            limits_resolver=fixed_limits(rate, daily_tokens, max_streams),
            **kwargs,
        )
        made.append(limiter)
        return limiter

    make.backend = request.param  # type: ignore[attr-defined]
    make.shared_memory = shared_memory  # type: ignore[attr-defined]
    yield make
    for limiter in made:
        await limiter.aclose()
    if url:
        delete_keys(prefix)


def admitted(results: list[Admission | Rejection]) -> list[Admission]:
    return [r for r in results if isinstance(r, Admission)]


def rejected(results: list[Admission | Rejection]) -> list[Rejection]:
    return [r for r in results if isinstance(r, Rejection)]


# --- request rate ------------------------------------------------------------------------


async def test_exactly_the_limit_is_admitted_when_100_prompts_arrive_at_once(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(rate="5/minute")
    results = await asyncio.gather(*(limiter.admit(1, estimate_tokens=10) for _ in range(100)))
    assert len(admitted(results)) == 5
    assert {r.code for r in rejected(results)} == {"rate_limited"}


async def test_the_limit_is_per_user(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(rate="2/minute")
    for _ in range(2):
        assert isinstance(await limiter.admit(1, estimate_tokens=1), Admission)
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Rejection)
    assert isinstance(await limiter.admit(2, estimate_tokens=1), Admission)


async def test_the_window_slides_and_readmits_once_the_oldest_prompt_leaves_it(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(rate="3/2second")
    first = [await limiter.admit(1, estimate_tokens=1) for _ in range(3)]
    assert len(admitted(first)) == 3
    refused = await limiter.admit(1, estimate_tokens=1)
    assert isinstance(refused, Rejection)
    assert refused.code == "rate_limited"
    assert 1 <= refused.retry_after <= 2
    # Sleep exactly until the moment the limiter named, not a fixed generous pause.
    await asyncio.sleep(max(0.0, refused.reset_at - time.time()) + 0.05)
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Admission)


async def test_every_limit_in_the_rate_string_applies(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(rate="10/minute;3/hour")
    results = [await limiter.admit(1, estimate_tokens=1) for _ in range(4)]
    assert len(admitted(results)) == 3
    refusal = rejected(results)[0]
    # The hour limit refused, so the message names it and the wait is close to an hour.
    assert "3 messages per hour" in refusal.message
    assert 3500 < refusal.retry_after <= 3600


async def test_a_rate_rejection_names_the_limit_and_when_to_retry(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(rate="1/minute")
    await limiter.admit(1, estimate_tokens=1)
    before = time.time()
    refusal = await limiter.admit(1, estimate_tokens=1)
    assert isinstance(refusal, Rejection)
    assert 55 <= refusal.retry_after <= 60
    assert refusal.message == (
        f"You can send 1 message per minute. Try again in {human_duration(refusal.retry_after)}."
    )
    assert before + 55 <= refusal.reset_at <= time.time() + 60


async def test_http_requests_are_limited_per_key(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    assert await limiter.hit_http("ip:192.0.2.1", "2/minute") is None
    assert await limiter.hit_http("ip:192.0.2.1", "2/minute") is None
    refusal = await limiter.hit_http("ip:192.0.2.1", "2/minute")
    assert refusal is not None
    assert refusal.code == "rate_limited"
    assert "2 requests per minute" in refusal.message
    assert await limiter.hit_http("ip:192.0.2.2", "2/minute") is None


async def test_http_and_chat_counts_are_separate(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(rate="1/minute")
    assert await limiter.hit_http("1", "1/minute") is None
    # Same user id, but the HTTP hit must not have used the chat allowance.
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Admission)


# --- daily tokens --------------------------------------------------------------------------


async def test_only_one_of_five_simultaneous_turns_fits_a_quota_of_1000_at_600_each(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    results = await asyncio.gather(*(limiter.admit(1, estimate_tokens=600) for _ in range(5)))
    assert len(admitted(results)) == 1
    assert {r.code for r in rejected(results)} == {"quota_exceeded"}
    assert await limiter.tokens_today(1) == (600, 1000)


async def test_settling_with_fewer_tokens_refunds_the_difference(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(admission, Admission)
    assert admission.reserved == 600
    await admission.settle(250)
    assert admission.settled
    assert await limiter.tokens_today(1) == (250, 1000)


async def test_settling_twice_changes_nothing(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(admission, Admission)
    await admission.settle(250)
    await admission.settle(900)
    await admission.settle(None)
    assert await limiter.tokens_today(1) == (250, 1000)


@pytest.mark.parametrize("used", [None, 0])
async def test_a_failed_turn_that_delivered_nothing_is_refunded_in_full(
    make_limiter: MakeLimiter, used: int | None
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(admission, Admission)
    await admission.settle(used)
    assert await limiter.tokens_today(1) == (0, 1000)


async def test_using_more_than_reserved_charges_the_extra(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=100)
    assert isinstance(admission, Admission)
    await admission.settle(700)
    assert await limiter.tokens_today(1) == (700, 1000)
    refusal = await limiter.admit(1, estimate_tokens=400)
    assert isinstance(refusal, Rejection)
    assert refusal.code == "quota_exceeded"


async def test_a_refund_makes_room_for_the_next_turn(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(daily_tokens=1000)
    first = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(await limiter.admit(1, estimate_tokens=600), Rejection)
    assert isinstance(first, Admission)
    await first.settle(100)
    assert isinstance(await limiter.admit(1, estimate_tokens=600), Admission)


async def test_an_estimate_above_the_whole_quota_needs_a_fresh_day_but_is_not_refused(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=5000)
    assert isinstance(admission, Admission)
    assert admission.reserved == 1000
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Rejection)


async def test_an_unlimited_quota_admits_any_amount_and_still_counts_it(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=0)
    for _ in range(3):
        admission = await limiter.admit(1, estimate_tokens=10**9)
        assert isinstance(admission, Admission)
        await admission.settle(500)
    # The meter still shows what was used, so switching the user to a plan mid-day is fair.
    assert await limiter.tokens_today(1) == (1500, 0)


async def test_a_quota_rejection_says_the_quota_is_used_and_when_it_resets(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=200_000)
    admission = await limiter.admit(1, estimate_tokens=200_000)
    assert isinstance(admission, Admission)
    refusal = await limiter.admit(1, estimate_tokens=10)
    assert isinstance(refusal, Rejection)
    assert refusal.message == (
        "You have used today's 200,000 tokens. The quota resets at 00:00 UTC "
        f"(in {human_duration(refusal.retry_after)})."
    )
    reset = datetime.fromtimestamp(refusal.reset_at, UTC)
    assert (reset.hour, reset.minute, reset.second) == (0, 0, 0)
    assert 1 <= refusal.retry_after <= 86400
    assert abs(refusal.reset_at - time.time() - refusal.retry_after) <= 1


async def test_a_quota_rejection_with_tokens_left_says_how_many(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    await limiter.admit(1, estimate_tokens=700)
    refusal = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(refusal, Rejection)
    assert refusal.message.startswith(
        "Only 300 of today's 1,000 tokens are left: too few for this message and an answer "
        "(it needs at least 600). The quota resets at 00:00 UTC (in "
    )


async def test_an_admin_reset_gives_back_todays_tokens(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=1000)
    assert isinstance(admission, Admission)
    await admission.settle(1000)
    await limiter.reset_today(1)
    assert await limiter.tokens_today(1) == (0, 1000)
    assert isinstance(await limiter.admit(1, estimate_tokens=1000), Admission)


async def test_a_refund_after_an_admin_reset_does_not_go_below_zero(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=800)
    assert isinstance(admission, Admission)
    await limiter.reset_today(1)
    await admission.settle(None)
    assert await limiter.tokens_today(1) == (0, 1000)


# --- concurrent streams ----------------------------------------------------------------------


async def test_a_third_stream_is_refused_when_two_are_allowed(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(max_streams=2)
    results = await asyncio.gather(*(limiter.admit(1, estimate_tokens=1) for _ in range(3)))
    assert len(admitted(results)) == 2
    (refusal,) = rejected(results)
    assert refusal.code == "too_many_streams"
    assert refusal.message == (
        "You already have 2 answers streaming. You can send this when one of them ends, "
        "or stop one first."
    )
    # The wait lasts until an answer ends: no moment can be promised, only the least wait (the
    # contract's retry_after) and what to wait for.
    assert (refusal.retry_after, refusal.reset_at) == (1, None)
    assert refusal.retry_when == "stream_ends"


async def test_settling_a_stream_frees_its_slot(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(max_streams=2)
    first = await limiter.admit(1, estimate_tokens=1)
    await limiter.admit(1, estimate_tokens=1)
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Rejection)
    assert isinstance(first, Admission)
    await first.settle(1)
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Admission)


async def test_a_title_takes_no_stream_slot_and_titles_have_a_cap_of_their_own(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(max_streams=1, daily_tokens=1000)
    title = await limiter.admit(1, estimate_tokens=30, pool="titles")
    assert isinstance(title, Admission)
    # The user's one stream slot is still free for their next prompt, and stays theirs.
    answer = await limiter.admit(1, estimate_tokens=100)
    assert isinstance(answer, Admission)
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Rejection)
    # A second title in flight is over the cap (the same number as the streams').
    refused = await limiter.admit(1, estimate_tokens=30, pool="titles")
    assert isinstance(refused, Rejection) and refused.code == "too_many_streams"
    # Its tokens still count against the quota, and settling frees its own slot only.
    assert await limiter.tokens_today(1) == (130, 1000)
    await title.settle(20)
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Rejection)
    assert isinstance(await limiter.admit(1, estimate_tokens=30, pool="titles"), Admission)
    assert await limiter.tokens_today(1) == (150, 1000)


async def test_a_refused_stream_gives_back_nothing_it_did_not_take(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(max_streams=1, daily_tokens=1000)
    await limiter.admit(1, estimate_tokens=300)
    assert isinstance(await limiter.admit(1, estimate_tokens=300), Rejection)
    # The refused prompt reserved no tokens.
    assert await limiter.tokens_today(1) == (300, 1000)


async def test_a_slot_of_a_dead_instance_expires_with_its_lease(
    make_limiter: MakeLimiter,
) -> None:
    dead = make_limiter(max_streams=1, lease_seconds=0.3)
    alive = (
        dead
        if make_limiter.backend == "memory"
        else make_limiter(  # type: ignore[attr-defined]
            max_streams=1, lease_seconds=0.3
        )
    )
    assert isinstance(await dead.admit(1, estimate_tokens=1), Admission)
    await dead.aclose()  # the instance dies without settling or refreshing
    assert isinstance(await alive.admit(1, estimate_tokens=1), Rejection)
    await asyncio.sleep(0.4)
    assert isinstance(await alive.admit(1, estimate_tokens=1), Admission)


async def test_refreshing_keeps_a_slot_past_its_first_lease(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(max_streams=1, lease_seconds=0.6)
    holder = await limiter.admit(1, estimate_tokens=1)
    assert isinstance(holder, Admission)
    for _ in range(4):  # 0.8 s in all, longer than one lease
        await asyncio.sleep(0.2)
        await holder.refresh()
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Rejection)
    await holder.settle(1)
    await holder.refresh()  # after settling: a no-op, the slot is not recreated
    assert isinstance(await limiter.admit(1, estimate_tokens=1), Admission)


async def test_the_refresh_interval_leaves_room_for_two_missed_refreshes() -> None:
    limiter = Limiter("", lease_seconds=30, limits_resolver=fixed_limits())
    admission = await limiter.admit(1, estimate_tokens=1)
    assert isinstance(admission, Admission)
    assert admission.refresh_interval == 10


# --- two processes on one Redis --------------------------------------------------------------

CHILD = """
import asyncio, json, sys
import django
django.setup()
from chat.limits.limiter import Admission, Limiter
from chat.limits.plans import UserLimits

async def resolve(user_id):
    return UserLimits("5/minute", 0, 1000, "test", False)

async def main():
    limiter = Limiter(sys.argv[1], prefix=sys.argv[2], limits_resolver=resolve, failure="closed")
    await limiter.tokens_today(999)  # open a connection before the race starts
    print("ready", flush=True)
    sys.stdin.readline()
    results = await asyncio.gather(*(limiter.admit(1, estimate_tokens=1) for _ in range(50)))
    print(json.dumps({
        "admitted": sum(isinstance(r, Admission) for r in results),
        "codes": sorted({r.code for r in results if not isinstance(r, Admission)}),
    }), flush=True)
    await limiter.aclose()

asyncio.run(main())
"""


@pytest.mark.redis
def test_two_processes_firing_at_once_admit_exactly_the_limit_between_them(
    redis_prefix: str,
) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings", "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, REDIS_URL, redis_prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:  # release both as close together as we can
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = [json.loads(child.communicate(timeout=60)[0]) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert all(child.returncode == 0 for child in children)
    assert sum(r["admitted"] for r in reports) == 5
    assert all(r["codes"] == ["rate_limited"] for r in reports)


# --- Redis down ------------------------------------------------------------------------------


async def test_with_redis_down_the_open_policy_admits_and_counts_the_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = Limiter(
        DEAD_REDIS_URL,
        prefix="test:dead:",
        failure="open",
        limits_resolver=fixed_limits(daily_tokens=1000),
    )
    before = metrics.limiter_failure_count("admit")
    with caplog.at_level(logging.WARNING, logger="chat.limits.limiter"):
        admission = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(admission, Admission)
    assert admission.degraded
    assert metrics.limiter_failure_count("admit") == before + 1
    assert "unavailable during admit" in caplog.text
    # Neither refreshing nor settling may raise while Redis is away.
    await admission.refresh()
    await admission.settle(100)
    assert admission.settled
    await limiter.aclose()


async def test_with_redis_down_the_closed_policy_refuses_with_a_clear_message() -> None:
    limiter = Limiter(
        DEAD_REDIS_URL, prefix="test:dead:", failure="closed", limits_resolver=fixed_limits()
    )
    refusal = await limiter.admit(1, estimate_tokens=1)
    assert isinstance(refusal, Rejection)
    assert refusal.code == "rate_limited"
    assert "temporarily unavailable" in refusal.message
    assert refusal.retry_after >= 1
    http_refusal = await limiter.hit_http("ip:192.0.2.1", "10/minute")
    assert http_refusal is not None
    assert http_refusal.code == "rate_limited"
    await limiter.aclose()


async def test_with_redis_down_the_meter_and_reset_do_not_raise() -> None:
    limiter = Limiter(
        DEAD_REDIS_URL,
        prefix="test:dead:",
        failure="open",
        limits_resolver=fixed_limits(daily_tokens=1000),
    )
    assert await limiter.tokens_today(1) == (0, 1000)
    await limiter.reset_today(1)
    assert await limiter.hit_http("ip:192.0.2.1", "1/minute") is None
    await limiter.aclose()


@pytest.mark.redis
async def test_settling_after_redis_went_away_does_not_raise(redis_prefix: str) -> None:
    limiter = Limiter(REDIS_URL, prefix=redis_prefix, limits_resolver=fixed_limits())
    admission = await limiter.admit(1, estimate_tokens=1)
    assert isinstance(admission, Admission)
    # Point the live admission's limiter at a refused port: a real connection failure.
    dead = Limiter(DEAD_REDIS_URL, prefix=redis_prefix, limits_resolver=fixed_limits())
    admission._limiter = dead
    before = metrics.limiter_failure_count("settle")
    await admission.settle(1)
    assert metrics.limiter_failure_count("settle") == before + 1
    await limiter.aclose()
    await dead.aclose()


# --- words -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0.2, "1 s"),
        (42, "42 s"),
        (60, "1 min"),
        (125, "2 min 5 s"),
        (3 * 3600 + 12 * 60 + 30, "3 h 12 min"),
        (7200, "2 h"),
        (2 * 86400 + 4 * 3600, "2 d 4 h"),
    ],
)
def test_durations_read_the_way_a_person_says_them(seconds: float, words: str) -> None:
    assert human_duration(seconds) == words


def test_a_rate_of_several_units_reads_as_every() -> None:
    (item,) = parse_rate("3/2second")
    assert describe_rate(item) == "3 messages every 2 seconds"


# --- limits from plans and quotas ------------------------------------------------------------

# limits_for reads the database from channels' worker thread (its own connection), so the data
# must be committed; serialized_rollback restores the seeded rows the flush removes, as the
# other transactional tests of the project expect.
pytest_db = pytest.mark.django_db(transaction=True, serialized_rollback=True)
SETTINGS_LIMITS = {
    "CHAT_RATE_LIMIT": "7/minute",
    "CHAT_DAILY_TOKENS": 1234,
    "CHAT_MAX_CONCURRENT_STREAMS": 3,
}


async def make_user(name: str = "ada") -> Any:
    """A user in a known state: no plans at all (a migration seeds a default plan; whether it
    is still there depends on which transactional test ran before)."""
    await Plan.objects.all().adelete()
    return await get_user_model().objects.acreate(username=f"{name}-{uuid.uuid4().hex[:8]}")


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_without_plan_or_quota_the_settings_apply() -> None:
    user = await make_user()
    assert await limits_for(user.id) == UserLimits(
        rate="7/minute",
        daily_tokens=1234,
        max_streams=3,
        plan="default",
        allow_full_on_mobile=False,
    )


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_the_default_plan_fills_in_what_it_sets() -> None:
    user = await make_user()
    await Plan.objects.acreate(
        name="Free", rate_limit="9/minute", is_default=True, allow_full_on_mobile=True
    )
    assert await limits_for(user.id) == UserLimits(
        rate="9/minute",
        daily_tokens=1234,
        max_streams=3,
        plan="Free",
        allow_full_on_mobile=True,
    )


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_each_limit_comes_from_the_first_layer_that_sets_it() -> None:
    user = await make_user()
    await Plan.objects.acreate(
        name="Free", max_concurrent_streams=4, daily_tokens=10, is_default=True
    )
    pro = await Plan.objects.acreate(name="Pro", daily_tokens=500_000)
    await Quota.objects.acreate(user=user, plan=pro, rate_limit="1/second")
    # Rate from the quota, tokens from its plan, streams from the default plan, 0 from none.
    assert await limits_for(user.id) == UserLimits(
        rate="1/second",
        daily_tokens=500_000,
        max_streams=4,
        plan="Pro",
        allow_full_on_mobile=False,
    )


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_a_zero_in_a_quota_means_unlimited_tokens_not_inherit() -> None:
    user = await make_user()
    await Plan.objects.acreate(name="Free", daily_tokens=10, is_default=True)
    await Quota.objects.acreate(user=user, daily_tokens=0)
    assert (await limits_for(user.id)).daily_tokens == 0


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_an_invalid_rate_typed_in_the_admin_falls_through_to_the_next_layer() -> None:
    user = await make_user()
    await Plan.objects.acreate(name="Free", rate_limit="9/minute", is_default=True)
    await Quota.objects.acreate(user=user, rate_limit="lots please")
    assert (await limits_for(user.id)).rate == "9/minute"


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_an_admin_edit_applies_on_the_next_lookup_without_waiting_for_the_cache() -> None:
    user = await make_user()
    plan = await Plan.objects.acreate(name="Free", daily_tokens=100, is_default=True)
    assert (await limits_for(user.id)).daily_tokens == 100
    plan.daily_tokens = 200
    await plan.asave()
    assert (await limits_for(user.id)).daily_tokens == 200
    quota = await Quota.objects.acreate(user=user, daily_tokens=300)
    assert (await limits_for(user.id)).daily_tokens == 300
    await quota.adelete()
    assert (await limits_for(user.id)).daily_tokens == 200


@pytest_db
@override_settings(**SETTINGS_LIMITS)
async def test_the_limiter_reads_the_users_quota_and_an_admin_raise_applies_at_once() -> None:
    user = await make_user()
    quota = await Quota.objects.acreate(user=user, rate_limit="2/minute")
    limiter = Limiter("", prefix="test:db:")
    results = [await limiter.admit(user.id, estimate_tokens=1) for _ in range(3)]
    assert [type(r) for r in results] == [Admission, Admission, Rejection]
    quota.rate_limit = "5/minute"
    await quota.asave()
    assert isinstance(await limiter.admit(user.id, estimate_tokens=1), Admission)


# --- one limiter per loop --------------------------------------------------------------------


@override_settings(REDIS_URL="", CHAT_REDIS_PREFIX="test:loop:")
async def test_get_limiter_gives_one_limiter_per_event_loop() -> None:
    limiter = get_limiter()
    assert get_limiter() is limiter
    assert limiter.backend_name == "memory"
    assert limiter.prefix == "test:loop:"

    def other_loop() -> Limiter:
        async def fetch() -> Limiter:
            return get_limiter()

        return asyncio.run(fetch())

    assert await asyncio.to_thread(other_loop) is not limiter


@override_settings(REDIS_URL="", CHAT_LIMITER_FAILURE="open")
async def test_changing_the_settings_gives_a_fresh_limiter() -> None:
    first = get_limiter()
    with override_settings(REDIS_URL=REDIS_URL, CHAT_LIMITER_FAILURE="closed"):
        second = get_limiter()
        assert (second.backend_name, second.failure) == ("redis", "closed")
        await second.aclose()
    assert first is not second
