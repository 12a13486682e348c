"""The re-spelling fuzz of tests/test_security_respelled.py over a real daphne, as production
runs: PostgreSQL (the stored messages are read from it) and the Redis limiter, over a real
socket. A user over the rate limit, at the stream cap or over the quota sends every kind of
turn frame in every spelling hypothesis finds; each is refused, stores nothing and sends
nothing to the model (counted by a recording hop in front of the demo model)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings

from tests.recording_upstream import recording_upstream
from tests.respelled_frames import (
    KINDS,
    SCENARIO_LIMITS,
    Spelled,
    Tab,
    check_refused,
    done_of,
    expected_code,
    fuzz_settings,
    holding_gate,
    prepare,
    reads_back,
    respelled,
)
from tests.servers import signup
from tests.test_daphne import (
    REDIS_URL,
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    ready,
    redis_prefix,
)
from tests.test_security_respelled import RESPELLED_PROMPT

pytestmark = [needs_postgres, pytest.mark.timeout(300)]

MESSAGES = """
    SELECT m.mid, m.role, m.status, m.conversation_id::text, p.mid, length(m.text)
    FROM chat_message m LEFT JOIN chat_message p ON p.id = m.parent_id
"""


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """One fresh database for the three scenarios (each has its own user and daphne)."""
    with fresh_postgres_database("chatsite_respelled") as url:
        yield url


def messages(database_url: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(MESSAGES).fetchall()
    return {mid: (role, status, c, parent, size) for mid, role, status, c, parent, size in rows}


def tab_for(ws: Any) -> Tab:
    async def receive() -> str:
        raw = await asyncio.wait_for(ws.recv(), 20)
        assert isinstance(raw, str)
        return raw

    return Tab(ws.send, receive)


@pytest.mark.parametrize("scenario", ["rate", "streams", "quota"])
async def test_no_respelled_turn_frame_starts_a_turn_over_a_limit_on_daphne_and_postgresql(
    database_url: str, demo_upstream: str, scenario: str
) -> None:
    rate, streams, tokens = SCENARIO_LIMITS[scenario]
    gate = holding_gate()

    async def snapshot() -> dict[str, tuple[Any, ...]]:
        return await asyncio.to_thread(messages, database_url)

    with (
        recording_upstream(demo_upstream, gate) as (upstream_url, recorded),
        redis_prefix() as prefix,
        daphne_instance(
            "web1",
            database_url=database_url,
            REDIS_URL=REDIS_URL,
            CHAT_REDIS_PREFIX=prefix,
            LLM_BASE_URL=upstream_url,
            LLM_READ_TIMEOUT="300",  # a held answer waits as long as the test
            CHAT_RATE_LIMIT=rate,
            CHAT_MAX_CONCURRENT_STREAMS=str(streams),
            CHAT_DAILY_TOKENS=str(tokens),
        ) as server,
    ):
        client = await asyncio.to_thread(signup, server.base, new_username())
        async with chat_socket(server.base, client) as setup_ws:
            await ready(setup_ws)
            setup = tab_for(setup_ws)
            targets = await prepare(setup, snapshot, recorded, scenario)
            async with chat_socket(server.base, client) as ws:
                await ready(ws)
                tab = tab_for(ws)
                loop = asyncio.get_running_loop()
                seen: Counter[str] = Counter()

                # hypothesis drives the examples from a worker thread; each frame is sent and
                # read on this loop, where the sockets live.
                @hypothesis_settings(fuzz_settings, max_examples=200)
                @given(spelled=respelled(targets))
                @example(
                    spelled=Spelled("prompt", RESPELLED_PROMPT, json.loads(RESPELLED_PROMPT), False)
                )
                def run(spelled: Spelled) -> None:
                    assert reads_back(spelled), spelled.raw
                    seen[spelled.kind] += 1
                    seen["duplicated"] += spelled.duplicated
                    code = expected_code(spelled, scenario)
                    asyncio.run_coroutine_threadsafe(
                        check_refused(tab, snapshot, recorded, spelled.raw, code), loop
                    ).result(timeout=60)

                await asyncio.to_thread(run)
            assert {*KINDS, "duplicated"} <= set(seen), seen
            if scenario == "streams":
                # The answer in flight all along ends as it should once released.
                gate.open()
                assert (await done_of(setup))["status"] == "complete"
        assert "Traceback" not in server.log(), server.log()[-5000:]
