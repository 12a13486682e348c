"""The limiter's token budgets: reserve what is left (never more), fit a reservation to the
prompt, charge within the budgets, forgive a day without deleting it, and the site-wide
budget. Every behaviour on the memory backend and on the real Redis; two processes on Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from chat.limits.limiter import Admission, Rejection
from tests import test_ratelimit
from tests.test_ratelimit import REDIS_URL, ROOT, MakeLimiter, admitted, rejected

# The limiter tests' fixtures: limiters on both backends sharing a prefix, a Redis prefix.
make_limiter = test_ratelimit.make_limiter
redis_prefix = test_ratelimit.redis_prefix


async def test_a_turn_gets_what_is_left_when_it_wants_more_but_no_less_than_it_needs(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    first = await limiter.admit(1, estimate_tokens=700, at_least=50)
    assert isinstance(first, Admission) and first.reserved == 700
    second = await limiter.admit(1, estimate_tokens=700, at_least=50)
    assert isinstance(second, Admission) and second.reserved == 300
    refused = await limiter.admit(1, estimate_tokens=700, at_least=50)
    assert isinstance(refused, Rejection) and refused.code == "quota_exceeded"
    assert refused.message.startswith("You have used today's 1,000 tokens.")


async def test_a_hundred_turns_at_once_reserve_exactly_the_remainder(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    results = await asyncio.gather(
        *(limiter.admit(1, estimate_tokens=300, at_least=50) for _ in range(100))
    )
    assert sum(a.reserved for a in admitted(results)) == 1000
    assert sorted(a.reserved for a in admitted(results)) == [100, 300, 300, 300]
    assert {r.code for r in rejected(results)} == {"quota_exceeded"}
    assert await limiter.tokens_today(1) == (1000, 1000)


async def test_a_reservation_grows_at_most_to_what_is_left_and_shrinks_back(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=100, at_least=10)
    assert isinstance(admission, Admission)
    other = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(other, Admission)
    assert await admission.resize(900) == 400  # 1000 - 600 held by the other turn
    assert await limiter.tokens_today(1) == (1000, 1000)
    assert await admission.resize(150) == 150
    assert await limiter.tokens_today(1) == (750, 1000)
    await admission.settle(120)
    assert await admission.resize(900) == 150  # settled: nothing moves any more
    assert await limiter.tokens_today(1) == (720, 1000)


async def test_settling_never_counts_past_the_quota_whatever_the_upstream_reports(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    first = await limiter.admit(1, estimate_tokens=400)
    second = await limiter.admit(1, estimate_tokens=600)
    assert isinstance(first, Admission) and isinstance(second, Admission)
    # An upstream that reports (or a prompt estimate that was) more than reserved.
    assert await first.settle(5000) == 0
    assert await limiter.tokens_today(1) == (1000, 1000)
    await second.settle(100)
    assert await limiter.tokens_today(1) == (500, 1000)


async def test_a_reset_forgives_the_count_and_says_how_much(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=900)
    assert isinstance(admission, Admission)
    await admission.settle(900)
    assert await limiter.reset_today(1) == 900
    assert await limiter.tokens_today(1) == (0, 1000)
    assert await limiter.usable_today(1) == 1000
    assert await limiter.reset_today(1) == 0  # nothing new to forgive
    again = await limiter.admit(1, estimate_tokens=1000)
    assert isinstance(again, Admission)
    await again.settle(250)
    assert await limiter.tokens_today(1) == (250, 1000)


async def test_a_turn_in_flight_during_a_reset_cannot_leave_extra_tokens_behind(
    make_limiter: MakeLimiter,
) -> None:
    limiter = make_limiter(daily_tokens=1000)
    running = await limiter.admit(1, estimate_tokens=800)
    assert isinstance(running, Admission)
    await limiter.reset_today(1)
    await running.settle(None)  # its refund comes after the reset
    # The whole quota is back, and not a token more.
    full = await limiter.admit(1, estimate_tokens=5000, at_least=1)
    assert isinstance(full, Admission) and full.reserved == 1000


async def test_the_meter_shows_what_a_turn_can_use(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter(daily_tokens=1000)
    assert await limiter.usable_today(1) == 1000
    admission = await limiter.admit(1, estimate_tokens=985)
    assert isinstance(admission, Admission)
    await admission.settle(985)
    # 15 left: too few for any prompt and the shortest answer, so the meter says 0.
    assert await limiter.usable_today(1) == 0
    assert await make_limiter(daily_tokens=0).usable_today(1) is None


async def test_the_global_budget_is_shared_by_users_and_instances(
    make_limiter: MakeLimiter, settings: Any
) -> None:
    settings.CHAT_GLOBAL_DAILY_TOKENS = 1000
    web1, web2 = make_limiter(daily_tokens=0), make_limiter(daily_tokens=800)
    if make_limiter.backend == "memory":  # type: ignore[attr-defined]
        web2 = web1  # in memory the budget is per process: one "instance"
    first = await web1.admit(1, estimate_tokens=700, at_least=50)
    second = await web2.admit(2, estimate_tokens=700, at_least=50)
    assert isinstance(first, Admission) and isinstance(second, Admission)
    assert (first.reserved, second.reserved) == (700, 300)
    refused = await web1.admit(3, estimate_tokens=10)
    assert isinstance(refused, Rejection) and refused.code == "quota_exceeded"
    assert "for everyone" in refused.message
    assert await web2.usable_today(4) == 0
    await first.settle(100)
    assert await web1.usable_today(4) == 600


CHILD = """
import asyncio, json, sys
import django
django.setup()
from chat.limits.limiter import Admission, Limiter
from chat.limits.plans import UserLimits

async def resolve(user_id):
    return UserLimits("1000/minute", 1000, 1000, "test", False)

async def main():
    limiter = Limiter(sys.argv[1], prefix=sys.argv[2], limits_resolver=resolve, failure="closed")
    await limiter.tokens_today(999)  # open a connection before the race starts
    print("ready", flush=True)
    sys.stdin.readline()
    results = await asyncio.gather(
        *(limiter.admit(1, estimate_tokens=120, at_least=40) for _ in range(40))
    )
    print(json.dumps([r.reserved for r in results if isinstance(r, Admission)]), flush=True)
    await limiter.aclose()

asyncio.run(main())
"""


@pytest.mark.redis
def test_two_processes_reserve_exactly_the_quota_between_them(redis_prefix: str) -> None:
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
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reserved = [json.loads(child.communicate(timeout=60)[0]) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    everything = reserved[0] + reserved[1]
    assert sum(everything) == 1000
    assert all(40 <= r <= 120 for r in everything)


async def test_a_dead_turns_release_settles_what_it_holds_now_and_only_once(
    make_limiter: MakeLimiter,
) -> None:
    if make_limiter.backend == "memory":  # type: ignore[attr-defined]
        pytest.skip("in memory a dead process's counts die with it: nothing to release")
    limiter = make_limiter(daily_tokens=1000)
    admission = await limiter.admit(1, estimate_tokens=100, at_least=10)
    assert isinstance(admission, Admission)
    record = admission.record()  # kept with the answer row when the turn started
    assert record is not None and record["reserved"] == 100
    assert await admission.resize(400) == 400  # the row's figure is stale from here on
    # Its process dies; the reaper charges what was delivered and frees what it held.
    await limiter.release_dead(1, record, 150)
    assert await limiter.tokens_today(1) == (150, 1000)
    # Reaped twice, or the turn settling after all: nothing more moves.
    await limiter.release_dead(1, record, 150)
    assert await admission.settle(150) == 850
    assert await limiter.tokens_today(1) == (150, 1000)
