"""No turn starts without an admission, however its frame is spelled (issue 13, finding 1).

A turn-starting frame re-spelled on the wire (`{"type":"\\u0070rompt",…}`) once skipped the
rate limit, the stream cap and the quota: the middleware decided from substrings of the raw
text, the consumer from `json.loads`, and the consumer started a turn with no admission. Here,
through the real ASGI app on SQLite with the in-memory limiter (and Redis where marked), a
user over each limit sends every kind of turn frame in every spelling hypothesis finds; each
must be refused, store nothing and send nothing upstream. The same fuzz runs over a real
daphne on PostgreSQL and Redis in tests/test_security_respelled_postgres.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings

from chat import protocol
from chat.middleware import FrameASGIMiddleware
from chat.models import Message
from tests.conftest import REDIS_URL
from tests.recording_upstream import Gate, Recorded, recording_upstream
from tests.respelled_frames import (
    KINDS,
    SCENARIO_LIMITS,
    Spelled,
    Tab,
    Targets,
    check_refused,
    done_of,
    expected_code,
    frame,
    fuzz_settings,
    hold_an_answer,
    holding_gate,
    prepare,
    reads_back,
    respelled,
)

pytestmark = pytest.mark.usefixtures("chat_settings")

# The review's own frame, and a regeneration spelled the same way.
RESPELLED_PROMPT = '{"type": "\\u0070rompt", "conversation": "", "text": "/long 5000"}'


def respelled_regenerate(mid: str) -> str:
    return '{ "mid":"' + mid + '",\n"\\u0074ype" : "re\\u0067enerate" }'


Upstream = tuple[Recorded, Gate]


@pytest.fixture
def upstream(chat_settings: Any, demo_upstream: str) -> Iterator[Upstream]:
    """The demo model behind a recording hop that holds requests asking for it."""
    gate = holding_gate()
    with recording_upstream(demo_upstream, gate) as (url, recorded):
        chat_settings.LLM_BASE_URL = url
        chat_settings.LLM_READ_TIMEOUT = 300.0  # a held answer waits as long as the test
        yield recorded, gate


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: Any, settings: Any, redis_prefix: str) -> str:
    if request.param == "redis":
        settings.REDIS_URL = REDIS_URL
    return str(request.param)


def limit(settings: Any, scenario: str) -> None:
    rate, streams, tokens = SCENARIO_LIMITS[scenario]
    settings.CHAT_RATE_LIMIT = rate
    settings.CHAT_MAX_CONCURRENT_STREAMS = streams
    settings.CHAT_DAILY_TOKENS = tokens


def tab_for(comm: Any) -> Tab:
    async def send(text: str) -> None:
        await comm.send_to(text_data=text)

    async def receive() -> str:
        return str(await comm.receive_from(timeout=15))

    return Tab(send, receive)


def _messages() -> dict[str, tuple[Any, ...]]:
    rows = Message.objects.values_list(
        "mid", "role", "status", "conversation_id", "parent__mid", "text"
    )
    return {
        mid: (role, status, str(c), parent, len(text))
        for mid, role, status, c, parent, text in rows
    }


snapshot = database_sync_to_async(_messages)


# --- the fuzz --------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["rate", "streams", "quota"])
async def test_no_respelled_turn_frame_starts_a_turn_over_a_limit(
    connect: Any, owner: Any, settings: Any, upstream: Upstream, scenario: str
) -> None:
    recorded, gate = upstream
    limit(settings, scenario)
    setup = tab_for(await connect(owner))
    targets = await prepare(setup, snapshot, recorded, scenario)
    tab = tab_for(await connect(owner))  # nothing of the setup is left to read on it
    loop = asyncio.get_running_loop()
    seen: Counter[str] = Counter()

    # hypothesis drives the examples from a worker thread; each frame is sent and read on this
    # loop, where the socket and the turns live.
    @hypothesis_settings(fuzz_settings, max_examples=200)
    @given(spelled=respelled(targets))
    @example(spelled=Spelled("prompt", RESPELLED_PROMPT, json.loads(RESPELLED_PROMPT), False))
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
        await frames_were_real(setup, gate, targets)


async def frames_were_real(setup: Tab, gate: Gate, targets: Targets) -> None:
    """The control: once the answer in flight ends, a re-spelled continue of the same stopped
    answer is admitted and streams (the refused frames were refused for the limit alone)."""
    gate.open()
    assert (await done_of(setup))["status"] == "complete"
    mid = "".join(f"\\u{ord(ch):04x}" for ch in targets.stopped)
    await setup.send('{"mid": "' + mid + '", "type": "\\u0063ontinue"}')
    done = await done_of(setup)
    assert done["mid"] == targets.stopped and done["status"] == "complete"


# --- plain regressions ----------------------------------------------------------------------


async def test_a_respelled_prompt_and_regenerate_over_the_rate_limit_are_refused(
    connect: Any, owner: Any, settings: Any, upstream: Upstream, backend: str
) -> None:
    recorded, _gate = upstream
    settings.CHAT_RATE_LIMIT = "1/hour"
    tab = tab_for(await connect(owner))
    await tab.send(frame("prompt", conversation="", text="/echo first"))
    answer = (await done_of(tab))["mid"]
    for raw in (RESPELLED_PROMPT, respelled_regenerate(answer)):
        refusal = await check_refused(tab, snapshot, recorded, raw, "rate_limited")
        assert refusal["retry_after"] >= 1


async def test_a_respelled_prompt_and_regenerate_at_the_stream_cap_are_refused(
    connect: Any, owner: Any, settings: Any, upstream: Upstream, backend: str
) -> None:
    recorded, gate = upstream
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    tab = tab_for(await connect(owner))
    await tab.send(frame("prompt", conversation="", text="/echo first"))
    answer = (await done_of(tab))["mid"]
    await hold_an_answer(tab, snapshot, recorded, "")  # the one stream allowed, in flight
    for raw in (RESPELLED_PROMPT, respelled_regenerate(answer)):
        refusal = await check_refused(tab, snapshot, recorded, raw, "too_many_streams")
        assert refusal["retry_when"] == "stream_ends"
    gate.open()
    assert (await done_of(tab))["status"] == "complete"


@pytest.mark.parametrize("verdict", ["missing", "not an admission"])
async def test_a_turn_frame_that_reaches_the_consumer_without_an_admission_starts_nothing(
    connect: Any,
    owner: Any,
    upstream: Upstream,
    monkeypatch: pytest.MonkeyPatch,
    verdict: str,
) -> None:
    """Fail closed: the consumer refuses a turn whose event carries no admission, as if a
    middleware in front of it forgot to ask the limiter. No request can cause that from
    outside, so the middleware's `decide` is wrapped to lose (or forge) the verdict."""
    recorded, _gate = upstream
    tab = tab_for(await connect(owner))
    targets = await prepare(tab, snapshot, recorded, "none")
    real_decide = FrameASGIMiddleware.decide

    async def forgetful(
        self: FrameASGIMiddleware, scope: dict[str, Any], message: dict[str, Any]
    ) -> dict[str, Any]:
        decided = await real_decide(self, scope, message)
        admission = decided.pop(protocol.VERDICT_KEY, None)
        if hasattr(admission, "settle"):
            await admission.settle(None)  # give back what was reserved: only the event forgets
        if verdict == "not an admission":
            decided[protocol.VERDICT_KEY] = True
        return decided

    monkeypatch.setattr(FrameASGIMiddleware, "decide", forgetful)
    c = targets.conversation
    for raw in (
        frame("prompt", conversation="", text="/echo hi"),
        frame("prompt", conversation=c, text="/echo edited", replaces=targets.prompt),
        frame("regenerate", mid=targets.answer),
        frame("regenerate", mid=targets.failed),
        frame("continue", mid=targets.stopped),
    ):
        refusal = await check_refused(tab, snapshot, recorded, raw, "unavailable")
        assert "cannot take messages" in refusal["message"]
    # The same socket takes a turn again once its events carry their admissions.
    monkeypatch.undo()
    await tab.send(frame("regenerate", mid=targets.answer))
    assert (await done_of(tab))["status"] == "complete"
