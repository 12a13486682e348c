"""The daily token quota as a user meets it over the socket: an answer is capped at what is
left, the remainder can be spent (and no more, whatever the tabs or the spelling of the
frames), and what a turn reserved and did not use comes back exactly once.

Every test runs on the in-memory limiter and on the real Redis, through the real ASGI app.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db.models import F, Sum

from chat.limits.budget import MIN_ANSWER_TOKENS, turn_ask
from chat.limits.limiter import Admission, get_limiter
from chat.models import Message, Usage
from chat.turns import turn as turn_module
from chat.turns.registry import registry
from tests.conftest import REDIS_URL, assistant_mid, receive_until_done
from tests.hostile_upstream import hostile_upstream

pytestmark = pytest.mark.usefixtures("chat_settings")


@pytest.fixture(params=["memory", "redis"])
def backend(request: Any, settings: Any, redis_prefix: str) -> str:
    if request.param == "redis":
        settings.REDIS_URL = REDIS_URL
    return str(request.param)


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


async def next_error(comm: Any) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{") and (frame := json.loads(raw))["type"] == "error":
            return frame


async def spend(user_id: int, tokens: int) -> None:
    """Spend tokens of today's quota as an earlier turn would have (no Usage row)."""
    admission = await get_limiter().admit(user_id, estimate_tokens=tokens)
    assert isinstance(admission, Admission), admission
    await admission.settle(tokens)


async def hold(user_id: int, tokens: int) -> Admission:
    """A turn of the same user in flight elsewhere, holding `tokens`: a refund given twice
    (or never) by the turn under test shows in the count next to it."""
    admission = await get_limiter().admit(user_id, estimate_tokens=tokens)
    assert isinstance(admission, Admission), admission
    assert admission.reserved == tokens
    return admission


async def counted(user_id: int) -> int:
    used, _ = await get_limiter().tokens_today(user_id)
    return used


async def usage_rows(user_id: int) -> int:
    def total() -> int:
        tokens = Usage.objects.filter(user_id=user_id).aggregate(
            t=Sum(F("prompt_tokens") + F("completion_tokens"))
        )["t"]
        return int(tokens or 0)

    return int(await database_sync_to_async(total)())


def spent(done: dict[str, Any]) -> int:
    return int(done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"])


async def prompts_stored() -> int:
    return int(await database_sync_to_async(Message.objects.filter(role="user").count)())


# --- an answer is capped at what is left -------------------------------------------------


async def test_two_long_answers_cannot_overrun_the_quota_together(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    # The review's case: two `/long 20000` spent 40,004 tokens of a 5,000 quota.
    settings.CHAT_DAILY_TOKENS = 5000
    tabs = [await connect(owner) for _ in range(2)]
    for tab in tabs:
        await tab.send_to(text_data=prompt("/long 20000"))
    dones = [(await receive_until_done(tab, timeout=60))["done"] for tab in tabs]
    assert sum(spent(done) for done in dones) <= 5000
    assert await counted(owner.pk) <= 5000
    assert await usage_rows(owner.pk) <= 5000
    # Whichever got the smaller part stopped at it, and said why.
    stopped = [done for done in dones if done["status"] == "stopped"]
    assert stopped and all("daily quota reached" in done["error"] for done in stopped)


async def test_with_715_tokens_left_a_prompt_is_answered_and_the_meter_goes_down(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    # Each prompt used to reserve 1,000 tokens, so 715 left refused every prompt.
    settings.CHAT_DAILY_TOKENS = 5000
    await spend(owner.pk, 5000 - 715)
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo hello"))
    answer = await receive_until_done(comm)
    assert answer["done"]["status"] == "complete"
    assert answer["text"] == "hello"
    assert answer["done"]["tokens_left"] == 715 - spent(answer["done"])


async def test_a_prompt_with_almost_nothing_left_is_refused_with_the_reset_time(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 5000
    await spend(owner.pk, 5000 - 20)
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo hi"))
    error = await next_error(comm)
    assert error["code"] == "quota_exceeded"
    # "Almost nothing": too few for this prompt and the shortest useful answer.
    needed = turn_ask("/echo hi", None).at_least
    # 8 characters (~2 tokens), ~4 for the message's template, the shortest useful answer.
    assert needed == 2 + 4 + MIN_ANSWER_TOKENS
    assert error["message"].startswith(
        f"Only 20 of today's 5,000 tokens are left: too few for this message and an answer "
        f"(it needs at least {needed}). The quota resets at 00:00 UTC (in "
    )
    assert 1 <= error["retry_after"] <= 86400
    assert abs(error["reset_at"] % 86400) < 1  # a UTC midnight
    assert await prompts_stored() == 0
    assert await counted(owner.pk) == 5000 - 20


async def test_concurrent_tabs_spend_a_small_remainder_up_to_the_last_usable_token(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 1000
    settings.LLM_MAX_TOKENS = 40  # short answers, so several fit the remainder at once
    await spend(owner.pk, 700)
    tabs = [await connect(owner) for _ in range(6)]
    ask = turn_ask("/long 300", None)
    outcomes: list[str] = []

    async def one_prompt(tab: Any) -> None:
        await tab.send_to(text_data=prompt("/long 300"))
        while True:
            raw = await tab.receive_from(timeout=20)
            if not raw.startswith("{"):
                continue
            frame = json.loads(raw)
            if frame["type"] == "error":
                outcomes.append(frame["code"])
                return
            if frame["type"] == "done":
                outcomes.append(frame["status"])
                assert spent(frame) <= ask.want  # never past the turn's own reservation
                return

    # Waves of simultaneous prompts from every tab until the remainder refuses them all.
    for _ in range(10):
        before = len(outcomes)
        await asyncio.gather(*(one_prompt(tab) for tab in tabs))
        if outcomes[before:].count("quota_exceeded") == len(tabs):
            break
    turns_spent = await usage_rows(owner.pk)
    assert outcomes.count("complete") + outcomes.count("stopped") >= 6
    # Never more than the remainder, and it was spent as far as a turn could use it.
    assert turns_spent <= 300
    assert await counted(owner.pk) <= 1000
    assert 1000 - await counted(owner.pk) < ask.at_least


# --- whatever the spelling of the frame -----------------------------------------------------


async def test_respelled_turn_frames_over_the_quota_start_nothing(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 3000
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo first"))
    first = await receive_until_done(comm)
    mid = first["done"]["mid"]
    await spend(owner.pk, 3000 - await counted(owner.pk))
    stored = await prompts_stored()
    spellings = [
        '{"type": "\\u0070rompt", "conversation": "", "text": "/long 5000"}',
        '{"text": "/long 5000", "conversation": "", "type": "prompt"}',
        '  {\n"type"\t:\r"prompt" , "text":"/long 5000","conversation":null}  ',
        '{"type": "prompt", "text": "/long 5000", "HEADERS": {"HX-Request": "true"}, "x": 1}',
        '{"type": "pr\\u006fmpt", "text": "\\u002flong 5000", "replaces": null}',
        f'{{"type": "\\u0072egenerate", "mid": "{mid}"}}',
        f'{{"mid": "{mid}", "type": "regenerate"}}',
        f'{{"type": "continue", "mid": "{mid}"}}',
    ]
    for raw in spellings:
        await comm.send_to(text_data=raw)
        error = await next_error(comm)
        assert error["code"] == "quota_exceeded", raw
    # A frame that says two things is refused before anyone guesses which one it meant.
    for raw in (
        '{"type": "stop", "type": "prompt", "text": "/long 5000"}',
        '{"type": "prompt", "text": "hi", "text": "/long 5000"}',
    ):
        await comm.send_to(text_data=raw)
        error = await next_error(comm)
        assert error["code"] == "bad_request", raw
        assert "repeat a key" in error["message"]
    assert await prompts_stored() == stored
    assert await counted(owner.pk) == 3000


async def test_a_respelled_prompt_admitted_with_a_small_remainder_cannot_exceed_it(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 2000
    await spend(owner.pk, 1700)
    comm = await connect(owner)
    await comm.send_to(
        text_data='{"text": "/long 5000", "type": "\\u0070rompt", "conversation": ""}'
    )
    done = (await receive_until_done(comm))["done"]
    assert done["status"] == "stopped" and "daily quota reached" in done["error"]
    assert spent(done) <= 300
    assert await counted(owner.pk) <= 2000


# --- refunds, exactly once --------------------------------------------------------------------


async def test_a_stopped_answer_is_charged_what_it_used_and_the_rest_comes_back_once(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str, backend: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    settings.CHAT_DAILY_TOKENS = 100_000
    other = await hold(owner.pk, 5000)
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/long 3000"))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    while json.loads(await comm.receive_from(timeout=10)).get("type") != "chunk":
        pass
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    done = (await receive_until_done(comm, mid, after=0))["done"]
    assert done["status"] == "stopped"
    # A second stop, after the end, changes nothing.
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    assert await counted(owner.pk) == 5000 + spent(done)
    await other.settle(None)
    assert await counted(owner.pk) == spent(done)


async def test_a_failed_answer_gives_everything_back_once(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 100_000
    other = await hold(owner.pk, 5000)
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/fail 503"))
    done = (await receive_until_done(comm))["done"]
    assert done["status"] == "failed"
    assert await counted(owner.pk) == 5000
    assert done["tokens_left"] == 100_000 - 5000
    await other.settle(None)


async def test_a_turn_that_crashes_while_finishing_still_gives_its_reservation_back(
    connect: Any, owner: Any, settings: Any, monkeypatch: Any, backend: str
) -> None:
    # A bug in the turn's own finish cannot be caused from outside: it is simulated by making
    # the rendering step, which runs before the turn settles, raise where it never should.
    settings.CHAT_DAILY_TOKENS = 100_000

    async def broken(self: Any, text: str) -> tuple[str, int | None]:
        raise RuntimeError("a bug in the turn's finish")

    monkeypatch.setattr(turn_module.Turn, "_render_rest", broken)
    started: list[turn_module.Turn] = []
    start = registry.start

    def recording_start(turn: turn_module.Turn) -> turn_module.Turn:
        started.append(turn)
        return start(turn)

    monkeypatch.setattr(registry, "start", recording_start)
    other = await hold(owner.pk, 5000)
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/fail 503"))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    (turn,) = started
    assert turn.mid == mid and turn.task is not None
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(turn.task, 10)
    assert turn.admission is not None and turn.admission.settled
    assert await counted(owner.pk) == 5000
    await other.settle(None)


# --- the stream cap and the global budget -------------------------------------------------


async def test_the_global_daily_budget_is_shared_by_every_user(
    connect: Any, owner: Any, other_user: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 0  # the users themselves are unlimited
    settings.CHAT_GLOBAL_DAILY_TOKENS = 300
    first = await connect(owner)
    await first.send_to(text_data=prompt("/long 1000"))
    done = (await receive_until_done(first))["done"]
    assert done["status"] == "stopped" and "daily quota reached" in done["error"]
    assert spent(done) <= 300
    assert done["tokens_left"] == 0
    second = await connect(other_user)
    await second.send_to(text_data=prompt("/echo hi"))
    error = await next_error(second)
    assert error["code"] == "quota_exceeded"
    assert error["message"].startswith(
        "The service has used up today's tokens for everyone, so new messages are paused "
        "until 00:00 UTC (in "
    )
    assert "not a limit of your account" in error["message"]
    assert error["retry_after"] >= 1


# --- an upstream that ignores max_tokens ----------------------------------------------------


async def test_an_upstream_that_ignores_max_tokens_is_stopped_at_what_the_turn_may_use(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 300
    with hostile_upstream(tokens=20_000) as (url, seen):
        settings.LLM_BASE_URL = url
        comm = await connect(owner)
        await comm.send_to(text_data=prompt("tell me everything"))
        answer = await receive_until_done(comm, timeout=30)
        assert await asyncio.to_thread(seen.done.wait, 10)
    done = answer["done"]
    assert done["status"] == "stopped" and "daily quota reached" in done["error"]
    (asked,) = seen.max_tokens
    assert asked is not None and 0 < asked < 300
    # Exactly the tokens it may use reached the tab, not a delta more...
    assert answer["text"] == "word " * asked
    assert await counted(owner.pk) <= 300
    # ...and the connection was closed on the server long before its 20,000 deltas.
    assert seen.hung_up == [True]
    assert seen.sent[0] < 20_000


async def test_an_upstream_that_packs_a_long_text_into_one_delta_is_stopped_too(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 300
    with hostile_upstream(tokens=5, delta_text="x" * 50_000) as (url, _):
        settings.LLM_BASE_URL = url
        comm = await connect(owner)
        await comm.send_to(text_data=prompt("tell me everything"))
        answer = await receive_until_done(comm, timeout=30)
    done = answer["done"]
    assert done["status"] == "stopped" and "daily quota reached" in done["error"]
    assert answer["text"] == ""  # the one delta was far past what the turn may use
    assert await counted(owner.pk) <= 300
