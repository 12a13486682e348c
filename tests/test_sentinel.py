"""Redis fails over under two chatsite instances: a Sentinel group of the test's own on loopback.

A primary, a replica and three sentinels (tests/sentinel.py); web1 and web2 (real daphne
processes) share a fresh PostgreSQL database and reach Redis only through
`REDIS_URL=redis+sentinel://…`. Their model server is the demo model behind a hop that holds
answers mid-way (tests/held_upstream.py), so that the primary is SIGKILLed while answers are
surely in flight; they stream on through the outage once released. Then: the answers
in flight end `complete` or `failed` with everything their tabs showed kept (never stuck: a
tab following one through the stream log on the other instance gets its end too); new turns run
on both instances; the limits stay exact; stops, the stream log and the channel layer work
through the new primary. Sentinel decides fast here, but nothing waits on a clock: every wait
is for a condition.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from tests.demo_server import running_demo_server
from tests.held_upstream import HeldAnswers, held_answers
from tests.sentinel import REDIS_SERVER, SentinelGroup, sentinel_group, wait_for
from tests.servers import signup
from tests.test_daphne import (
    Answer,
    Instance,
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    query_one,
    read_answer,
    ready,
    send_prompt,
)

pytestmark = [
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed"),
    needs_postgres,
    # Seven processes and a fresh database to start: minutes on a busy machine.
    pytest.mark.timeout(300),
]

RATE_LIMIT = 12
PREFIX = "chat:"
# Answers are held after this many of the model's events (a few chunks in)...
HELD_AFTER_EVENTS = 10
# ...and, released, stream on for ~3 s at the demo model's 200 tokens/s.
IN_FLIGHT = "/long 600"
ENV = {
    "CHAT_RATE_LIMIT": f"{RATE_LIMIT}/hour",
    "CHAT_MAX_CONCURRENT_STREAMS": "100",
    "CHAT_DAILY_TOKENS": "1000000",
    "CHAT_RESERVE_TOKENS": "1000",
    # While Redis has no primary, refuse rather than admit uncounted: exactness is the point.
    "CHAT_LIMITER_FAILURE": "closed",
    "CHAT_CHECKPOINT_SECONDS": "0.5",
    "CHAT_REDIS_PREFIX": PREFIX,
}


@dataclass
class Site:
    group: SentinelGroup
    model: HeldAnswers
    web1: Instance
    web2: Instance
    database_url: str


@pytest.fixture
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    failures = request.session.testsfailed
    with (
        sentinel_group() as group,
        running_demo_server(tps=200) as demo,
        held_answers(demo, HELD_AFTER_EVENTS) as model,
        fresh_postgres_database() as database_url,
    ):
        env = {**ENV, "REDIS_URL": group.url, "LLM_BASE_URL": model.url}
        with (
            daphne_instance("web1", database_url=database_url, **env) as web1,
            daphne_instance("web2", database_url=database_url, **env) as web2,
        ):
            yield Site(group, model, web1, web2, database_url)
            if request.session.testsfailed > failures:  # what each process said, to debug it
                print(group.logs(), web1.log()[-8000:], web2.log()[-8000:], sep="\n")


def ready_everywhere(site: Site) -> bool:
    """Both instances answer /readyz with 200: their health check reaches the primary."""
    return all(
        httpx.get(f"{web.base}/readyz", timeout=5).status_code == 200
        for web in (site.web1, site.web2)
    )


def subscribers_on(site: Site) -> int:
    """Control-channel subscriptions (one per instance) held on the current primary."""
    client = site.group.primary().client()
    try:
        clients = client.client_list()
    finally:
        client.close()
    return sum(c["name"] == f"{PREFIX}control-sub" and c["cmd"] == "subscribe" for c in clients)


def tokens_counted(site: Site, user_id: int) -> int:
    """Today's tokens of the user as the limiter counts them, read from the current primary."""
    client = site.group.primary().client()
    try:
        keys = client.keys(f"{PREFIX}{{u:{user_id}}}:tokens:*")
        return sum(int(client.get(key) or 0) for key in keys)
    finally:
        client.close()


def row(site: Site, mid: str | None) -> tuple[str, str, int]:
    found = query_one(
        site.database_url,
        "SELECT status, text, prompt_tokens + completion_tokens FROM chat_message WHERE mid = %s",
        mid,
    )
    assert found is not None
    return found[0], found[1], found[2]


async def exchange_reaches(ws: ClientConnection, site: Site, mid: str) -> None:
    """Read `ws`, a tab on a new chat, until the conversation of `mid` is added to its list.

    A tab that shows no conversation is sent only the list entry of another tab's new
    conversation (a fragment whose target is on its page), never the exchange itself.
    """
    found = query_one(
        site.database_url, "SELECT conversation_id FROM chat_message WHERE mid = %s", mid
    )
    assert found is not None
    entry = f'id="conv-{found[0]}"'
    while True:
        raw = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(raw, str) and "#conversation-list" in raw and entry in raw:
            return


async def one_prompt(ws: ClientConnection, text: str) -> Answer:
    await send_prompt(ws, text)
    return await read_answer(ws, timeout=30)


async def test_answers_in_flight_survive_a_failover_and_the_site_works_on_the_new_primary(
    site: Site,
) -> None:
    username = f"user{uuid.uuid4().hex[:8]}"
    client = signup(site.web1.base, username)
    found = query_one(site.database_url, "SELECT id FROM auth_user WHERE username = %s", username)
    assert found is not None
    user_id = found[0]
    async with (
        chat_socket(site.web1.base, client) as asker1,
        chat_socket(site.web2.base, client) as asker2,
        chat_socket(site.web2.base, client) as follower,
        chat_socket(site.web2.base, client) as watcher,
    ):
        for ws in (asker1, asker2, follower, watcher):
            await ready(ws)
        # Two answers in flight, one on each instance, held by the model server a few chunks
        # in; a tab on web2 follows web1's answer through the stream log.
        site.model.arm()
        await send_prompt(asker1, IN_FLIGHT)
        one = await read_answer(asker1, until_chunks=1)
        await send_prompt(asker2, IN_FLIGHT)
        two = await read_answer(asker2, until_chunks=1)
        await follower.send(json.dumps({"type": "resume", "mid": one.mid, "after": -1}))
        followed = await read_answer(follower, Answer(mid=one.mid), until_chunks=1)
        await asyncio.to_thread(site.model.wait_held, 2)
        # What Redis was told so far (the limiter's counts among it) is on the replica too:
        # from here on, anything lost is chatsite's doing, not asynchronous replication's.
        await asyncio.to_thread(wait_for, "the replica to catch up", site.group.replicated)

        in_flight = [
            asyncio.create_task(read_answer(ws, answer, timeout=90))
            for ws, answer in ((asker1, one), (asker2, two), (follower, followed))
        ]
        old_primary = site.group.primary()
        old_primary.kill()
        # The answers stream on while Redis has no primary, and the sentinels elect one.
        site.model.release()
        await asyncio.to_thread(site.group.wait_for_new_primary, old_primary)
        one, two, followed = await asyncio.gather(*in_flight)

        # Every answer in flight ended, as saved, with everything its tab showed.
        for answer in (one, two):
            assert answer.done is not None, "never stuck"
            status, text, _ = row(site, answer.mid)
            assert answer.done["status"] == status
            assert status in ("complete", "failed")
            assert answer.text == text, "what the tab showed is what was saved"
            assert answer.done["seq"] == len(answer.chunks)
        assert followed.done is not None, "the follower on the other instance is never stuck"
        assert followed.done["status"] == one.done["status"]  # type: ignore[index]
        assert row(site, one.mid)[1].startswith(followed.text)

        # The instances see the new primary: readiness, and each control subscription.
        await asyncio.to_thread(wait_for, "both instances ready", lambda: ready_everywhere(site))
        await asyncio.to_thread(wait_for, "two subscribers", lambda: subscribers_on(site) == 2)

        # New turns run on both instances, and another tab hears of them (channel layer).
        after1 = await one_prompt(asker1, "/echo after the failover, web1")
        assert after1.done is not None and after1.done["status"] == "complete"
        assert after1.text == "after the failover, web1"
        await exchange_reaches(watcher, site, str(after1.mid))
        after2 = await one_prompt(asker2, "/echo after the failover, web2")
        assert after2.done is not None and after2.done["status"] == "complete"

        # A stop sent to web2 reaches the turn on web1, which a tab on web2 follows live
        # through the log on the new primary.
        await send_prompt(asker1, "/long 5000")
        long = await read_answer(asker1, until_chunks=1)
        await follower.send(json.dumps({"type": "resume", "mid": long.mid, "after": -1}))
        seen = await read_answer(follower, Answer(mid=long.mid), until_chunks=1)
        await asker2.send(json.dumps({"type": "stop", "mid": long.mid}))
        long = await read_answer(asker1, long, timeout=30)
        seen = await read_answer(follower, seen, timeout=30)
        assert long.done is not None and long.done["status"] == "stopped"
        assert seen.done is not None and seen.done["status"] == "stopped"

        # The rate limit is exact: five prompts were admitted, so seven more are, one by
        # one across both instances, and the next is refused by the limit itself.
        admitted = 5
        tabs = [asker1, asker2]
        while True:
            answer = await one_prompt(tabs[admitted % 2], f"/echo {admitted}")
            if answer.errors:
                break
            assert answer.done is not None and answer.done["status"] == "complete"
            admitted += 1
        (refusal,) = answer.errors
        assert refusal["code"] == "rate_limited"
        # The limit's own refusal ("in about an hour"), not "limits are unavailable" (5 s).
        assert refusal["retry_after"] > 60, refusal
        assert admitted == RATE_LIMIT

    # The token counter agrees with what the turns charged, give or take the answers that
    # were in flight (a settle that met no primary leaves its reservation charged).
    charged = query_one(
        site.database_url,
        "SELECT sum(prompt_tokens + completion_tokens) FROM chat_usage WHERE user_id = %s",
        user_id,
    )
    assert charged is not None
    slack = sum(row(site, answer.mid)[2] + 1000 + 10 for answer in (one, two))
    assert abs(tokens_counted(site, user_id) - int(charged[0])) <= slack
