"""The daily quota on real daphne processes: two instances sharing Redis and PostgreSQL spend a
small remainder up to its last usable token and never past it; an admin's reset, clicked
through the real admin, gives the quota back while PostgreSQL keeps the day's history."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx

from chat.limits.budget import turn_ask
from chat.limits.limiter import Limiter
from chat.limits.plans import UserLimits
from tests.servers import ROOT, base_env, signup
from tests.test_daphne import (
    REDIS_URL,
    Instance,
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    next_json,
    query_one,
    ready,
    redis_prefix,
    send_prompt,
)

pytestmark = needs_postgres

QUOTA = 400
ENV = {
    "CHAT_DAILY_TOKENS": str(QUOTA),
    "LLM_MAX_TOKENS": "40",  # short answers: several fit the remainder at once
    "CHAT_RATE_LIMIT": "1000/minute",
    "CHAT_MAX_CONCURRENT_STREAMS": "100",
}


@contextlib.contextmanager
def instances(count: int, **env: str) -> Iterator[tuple[list[Instance], str, str]]:
    """`count` daphne instances on one fresh PostgreSQL database and one Redis prefix."""
    with (
        fresh_postgres_database() as database_url,
        redis_prefix() as prefix,
        contextlib.ExitStack() as stack,
    ):
        running = [
            stack.enter_context(
                daphne_instance(
                    f"web{n + 1}",
                    database_url=database_url,
                    REDIS_URL=REDIS_URL,
                    CHAT_REDIS_PREFIX=prefix,
                    **env,
                )
            )
            for n in range(count)
        ]
        yield running, database_url, prefix


async def counted(prefix: str, user_id: int) -> int:
    """The user's tokens counted today, read from the shared Redis as any instance would."""

    async def limits(_: int) -> UserLimits:
        return UserLimits("1000/minute", QUOTA, 100, "test", False)

    limiter = Limiter(REDIS_URL, prefix=prefix, limits_resolver=limits)
    try:
        used, _ = await limiter.tokens_today(user_id)
        return used
    finally:
        await limiter.aclose()


def user_id(database_url: str, username: str) -> int:
    row = query_one(database_url, "SELECT id FROM auth_user WHERE username = %s", username)
    assert row is not None
    return int(row[0])


def history_tokens(database_url: str, uid: int) -> int:
    row = query_one(
        database_url,
        "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM chat_usage"
        " WHERE user_id = %s",
        uid,
    )
    assert row is not None
    return int(row[0])


async def ask(base: str, client: httpx.Client, text: str) -> dict[str, Any]:
    """One prompt on a fresh socket: its `done`, or the `error` that refused it."""
    async with chat_socket(base, client) as ws:
        await ready(ws)
        await send_prompt(ws, text)
        while True:
            frame = await next_json(ws, timeout=30)
            if frame["type"] in ("done", "error"):
                return frame


async def test_tabs_on_two_instances_spend_the_remainder_and_never_more() -> None:
    with instances(2, **ENV) as (running, database_url, prefix):
        username = f"quota{datetime.now(UTC):%H%M%S%f}"
        client = signup(running[0].base, username)
        uid = user_id(database_url, username)
        ask_for = turn_ask("/long 300", None)
        outcomes: list[str] = []

        async def tab(base: str) -> None:
            async with chat_socket(base, client) as ws:
                await ready(ws)
                for _ in range(6):
                    await send_prompt(ws, "/long 300")
                    while (frame := await next_json(ws, timeout=30))["type"] not in (
                        "done",
                        "error",
                    ):
                        pass
                    outcomes.append(frame.get("code") or frame["status"])
                    if frame["type"] == "error":
                        return

        # Four tabs on each instance, all sending at once.
        await asyncio.gather(*(tab(instance.base) for instance in running for _ in range(4)))
        assert set(outcomes) <= {"complete", "stopped", "quota_exceeded"}, outcomes
        assert outcomes.count("quota_exceeded") == 8
        total = await counted(prefix, uid)
        # Never past the quota, in the count and in the history PostgreSQL keeps...
        assert total <= QUOTA
        assert history_tokens(database_url, uid) <= QUOTA
        # ...and spent as far as a turn could use it.
        assert QUOTA - total < ask_for.at_least


def admin_session(base: str, username: str, password: str) -> httpx.Client:
    """Log in through the admin's own login form, as a person would."""
    client = httpx.Client(base_url=base, follow_redirects=True, timeout=10)
    client.get("/admin/login/")
    response = client.post(
        "/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert "Plans, usage, models and chats" in response.text, response.text[:500]
    return client


ADMIN_ARGS = ("--username", "boss", "--email", "boss@example.com")


async def test_an_admin_reset_on_postgresql_gives_the_quota_back_and_keeps_the_day() -> None:
    password = "an-admin-passphrase-42"
    env = {**ENV, "LLM_MAX_TOKENS": "0"}
    with instances(1, **env) as (running, database_url, prefix):
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "manage.py", "createsuperuser", "--noinput", *ADMIN_ARGS],
            cwd=ROOT,
            env=base_env(DATABASE_URL=database_url, DJANGO_SUPERUSER_PASSWORD=password),
            check=True,
            capture_output=True,
        )
        base = running[0].base
        username = f"quota{datetime.now(UTC):%H%M%S%f}"
        client = signup(base, username)
        uid = user_id(database_url, username)
        first = await ask(base, client, "/long 1000")
        assert first["type"] == "done" and "daily quota reached" in first["error"]
        refused = await ask(base, client, "/echo again")
        assert refused["code"] == "quota_exceeded"
        spent = history_tokens(database_url, uid)
        assert 0 < spent <= QUOTA

        admin = admin_session(base, "boss", password)
        page = admin.get("/admin/auth/user/")
        admin.post(
            "/admin/auth/user/",
            data={
                "action": "reset_today",
                "_selected_action": [str(uid)],
                "csrfmiddlewaretoken": admin.cookies["csrftoken"],
                "index": "0",
            },
            headers={"Referer": str(page.url)},
        )
        # PostgreSQL keeps the day's history and records the reset beside it.
        assert history_tokens(database_url, uid) == spent
        row = query_one(database_url, "SELECT tokens FROM chat_usagereset WHERE user_id = %s", uid)
        assert row == (spent,)
        chart = admin.get(f"/admin/auth/user/{uid}/change/").text
        assert re.search(rf"{datetime.now(UTC):%Y-%m-%d}: {spent:,} tokens", chart)
        assert await counted(prefix, uid) == 0
        again = await ask(base, client, "/echo again")
        assert again["type"] == "done" and again["status"] == "complete"
        admin.close()
        client.close()
