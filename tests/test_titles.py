"""Titles (issue 17.4): after a new conversation's first answer the lite model names it, in the
background, within the user's limits, falling back to the prompt's first words; every tab of
the user sees it; a title typed by hand is never replaced."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat import conversations
from chat.models import Conversation, Usage
from chat.turns.titles import TITLE_MAX_TOKENS, fallback_title, title_conversation
from tests.conftest import assistant_mid, receive_until_done
from tests.recording_upstream import Gate, Recorded, recording_upstream

pytestmark = pytest.mark.usefixtures("chat_settings")

PROMPT = "Explain how a rainbow forms, in three short paragraphs."


@pytest.fixture
def recorded(chat_settings: Any, demo_upstream: str) -> Iterator[Recorded]:
    chat_settings.CHAT_TITLES = True
    with recording_upstream(demo_upstream) as (url, seen):
        chat_settings.LLM_BASE_URL = url
        yield seen


async def html_until(comm: Any, needle: str) -> str:
    while True:
        raw = await comm.receive_from(timeout=10)
        if needle in raw:
            return raw


def title_requests(recorded: Recorded) -> list[dict[str, Any]]:
    return [
        r
        for r in recorded.snapshot()
        if r["messages"][0]["role"] == "system"
        and r["messages"][0]["content"].startswith("Write a short title")
    ]


async def title_of(conversation_id: str) -> str:
    conv = await database_sync_to_async(Conversation.objects.get)(pk=conversation_id)
    return conv.title


async def test_the_first_answer_gets_a_title_from_the_lite_model_in_every_tab(
    connect: Any, owner: Any, other_user: Any, recorded: Recorded
) -> None:
    asking = await connect(owner)
    other_tab = await connect(owner)
    stranger = await connect(other_user)
    await asking.send_to(text_data=json.dumps({"type": "prompt", "text": PROMPT}))
    answer = await receive_until_done(asking)
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    # The answer came first, with the provisional title; the title follows it.
    assert answer["done"]["status"] == "complete"
    frame = await html_until(asking, f'id="conv-{conv.id}"')
    assert "Explain how a rainbow forms" in frame and 'hx-swap-oob="true"' in frame
    assert f'id="conv-{conv.id}"' in await html_until(other_tab, "Explain how a rainbow forms")
    assert await title_of(str(conv.id)) == "Explain how a rainbow forms"
    [request] = title_requests(recorded)
    assert request["model"] == "demo-lite" and request["max_tokens"] == TITLE_MAX_TOKENS
    assert request["messages"][1] == {"role": "user", "content": PROMPT}
    # Counted against the user's tokens, as the lite model's usage.
    rows = await database_sync_to_async(list)(Usage.objects.filter(user=owner, model="demo-lite"))
    assert rows and rows[0].requests >= 1 and rows[0].total_tokens > 0
    # Nothing of it reaches another user's socket.
    await stranger.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo mine"}))
    mine = await receive_until_done(stranger)
    assert not any(str(conv.id) in html for html in mine["html"])


async def test_a_later_answer_asks_for_no_title(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": PROMPT}))
    await receive_until_done(comm)
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    await html_until(comm, f'id="conv-{conv.id}"')
    again = {"type": "prompt", "conversation": str(conv.id), "text": "/echo more"}
    await comm.send_to(text_data=json.dumps(again))
    await receive_until_done(comm)
    assert len(title_requests(recorded)) == 1


async def test_a_first_answer_stopped_then_continued_gets_its_title_once_it_completes(
    connect: Any, owner: Any, chat_settings: Any, slow_demo_upstream: str
) -> None:
    chat_settings.CHAT_TITLES = True
    with recording_upstream(slow_demo_upstream) as (url, recorded):
        chat_settings.LLM_BASE_URL = url
        comm = await connect(owner)
        prompt = "How do I greet someone in Python?"
        await comm.send_to(text_data=json.dumps({"type": "prompt", "text": prompt}))
        mid = assistant_mid(await comm.receive_from(timeout=10))
        conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
        provisional = await title_of(str(conv.id))
        await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
        stopped = await receive_until_done(comm, mid)
        assert stopped["done"]["status"] == "stopped"
        # A stopped first answer makes no title (not yet: it may be continued or not).
        await asyncio.sleep(0.3)
        assert title_requests(recorded) == [] and await title_of(str(conv.id)) == provisional

        # Continued to its end, it is the first answer completed: the title follows it (it
        # never came, from a review), for every tab, as after a first answer that completed.
        await comm.send_to(text_data=json.dumps({"type": "continue", "mid": mid}))
        done = await receive_until_done(comm, mid, after=stopped["done"]["seq"] - 1)
        assert done["done"]["status"] == "complete"
        frame = await html_until(comm, "Greet someone in Python")
        assert f'id="conv-{conv.id}"' in frame
        assert await title_of(str(conv.id)) == "Greet someone in Python"
        [request] = title_requests(recorded)
        assert request["messages"][1] == {"role": "user", "content": prompt}


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_a_title_typed_by_hand_wins(owner: Any, recorded: Recorded) -> None:
    conv = await database_sync_to_async(Conversation.objects.create)(user=owner, title="x")
    await database_sync_to_async(conversations.do_rename_conversation)(conv, "My own title")
    assert await title_conversation(owner.pk, str(conv.id), PROMPT) is None
    assert await title_of(str(conv.id)) == "My own title"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_an_upstream_failure_falls_back_to_the_prompts_first_words(
    owner: Any, chat_settings: Any
) -> None:
    chat_settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens there
    conv = await database_sync_to_async(Conversation.objects.create)(user=owner, title="x")
    title = await title_conversation(owner.pk, str(conv.id), PROMPT)
    assert title == fallback_title(PROMPT) == "Explain how a rainbow forms, in…"
    assert await title_of(str(conv.id)) == title


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_a_rate_limited_user_gets_the_fallback_and_nothing_goes_upstream(
    owner: Any, chat_settings: Any, recorded: Recorded
) -> None:
    from chat.limits.limiter import get_limiter

    chat_settings.CHAT_RATE_LIMIT = "1/minute"
    spent = await get_limiter().admit(owner.pk, estimate_tokens=10)
    await spent.settle(10)  # type: ignore[union-attr]
    conv = await database_sync_to_async(Conversation.objects.create)(user=owner, title="x")
    assert await title_conversation(owner.pk, str(conv.id), PROMPT) == fallback_title(PROMPT)
    assert recorded.snapshot() == []


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_a_user_out_of_tokens_gets_the_fallback_and_nothing_goes_upstream(
    owner: Any, chat_settings: Any, recorded: Recorded
) -> None:
    from chat.limits.limiter import get_limiter

    chat_settings.CHAT_DAILY_TOKENS = 50
    spent = await get_limiter().admit(owner.pk, estimate_tokens=50)
    await spent.settle(50)  # type: ignore[union-attr]  # today's tokens are used up
    conv = await database_sync_to_async(Conversation.objects.create)(user=owner, title="x")
    assert await title_conversation(owner.pk, str(conv.id), PROMPT) == fallback_title(PROMPT)
    assert recorded.snapshot() == []


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_an_answer_streaming_at_the_stream_cap_does_not_stop_a_title(
    owner: Any, chat_settings: Any, recorded: Recorded
) -> None:
    from chat.limits.limiter import get_limiter

    chat_settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    holding = await get_limiter().admit(owner.pk, estimate_tokens=10)  # an answer streaming
    conv = await database_sync_to_async(Conversation.objects.create)(user=owner, title="x")
    # A title has slots of its own: the answer's slot is neither needed nor taken.
    assert await title_conversation(owner.pk, str(conv.id), PROMPT) == "Explain how a rainbow forms"
    assert len(title_requests(recorded)) == 1
    await holding.settle(None)  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_titles_in_flight_are_bounded_by_the_stream_cap(
    owner: Any, chat_settings: Any, recorded: Recorded
) -> None:
    from chat.limits.limiter import get_limiter

    # At a cap of 1, a second title while one is in flight is refused (nothing goes upstream,
    # the prompt's first words): titles cannot be used to run requests without bound.
    chat_settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    in_flight = await get_limiter().admit(owner.pk, estimate_tokens=10, pool="titles")
    conv = await database_sync_to_async(Conversation.objects.create)(user=owner, title="x")
    assert await title_conversation(owner.pk, str(conv.id), PROMPT) == fallback_title(PROMPT)
    assert recorded.snapshot() == []
    await in_flight.settle(None)  # type: ignore[union-attr]


async def test_at_a_cap_of_one_the_next_prompt_is_not_refused_while_a_title_is_written(
    connect: Any, owner: Any, chat_settings: Any, demo_upstream: str
) -> None:
    # The title request is held at the model server until the second answer is done: before
    # the fix it took the user's only stream slot and the second prompt was refused with
    # too_many_streams.
    chat_settings.CHAT_TITLES = True
    chat_settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    gate = Gate(lambda body: body["messages"][0]["content"].startswith("Write a short title"))
    with recording_upstream(demo_upstream, gate) as (url, seen):
        chat_settings.LLM_BASE_URL = url
        comm = await connect(owner)
        await comm.send_to(text_data=json.dumps({"type": "prompt", "text": PROMPT}))
        first = await receive_until_done(comm)
        assert first["done"]["status"] == "complete"
        conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
        # The title request is at the model server, held.
        assert await asyncio.to_thread(gate.arrived.wait, 10)
        assert len(title_requests(seen)) == 1
        again = {"type": "prompt", "conversation": str(conv.id), "text": "/echo and then?"}
        await comm.send_to(text_data=json.dumps(again))
        second = await receive_until_done(comm)
        assert second["errors"] == [] and second["done"]["status"] == "complete", second
        assert second["text"] == "and then?"
        gate.open()
        # The title still arrives, on the same socket.
        frame = await html_until(comm, "Explain how a rainbow forms")
        assert f'id="conv-{conv.id}"' in frame
        assert await title_of(str(conv.id)) == "Explain how a rainbow forms"
        # And the title's slot is given back: a third prompt is answered too.
        third = {"type": "prompt", "conversation": str(conv.id), "text": "/echo third"}
        await comm.send_to(text_data=json.dumps(third))
        assert (await receive_until_done(comm))["done"]["status"] == "complete"


async def test_titles_do_not_count_as_the_users_messages(
    connect: Any, owner: Any, chat_settings: Any, recorded: Recorded
) -> None:
    # Three new chats at 3 messages a minute: all three prompts are answered (a title counted
    # as a message made the 3rd prompt of a minute refused). A title is still refused once the
    # user is at the limit: the third chat keeps its provisional title.
    chat_settings.CHAT_RATE_LIMIT = "3/minute"
    comm = await connect(owner)
    for name in ("alpha", "bravo", "charlie"):
        await comm.send_to(text_data=json.dumps({"type": "prompt", "text": f"/echo {name}"}))
        answer = await receive_until_done(comm)
        assert answer["done"]["status"] == "complete", answer
        if name != "charlie":
            await html_until(comm, f">{name.capitalize()}<")  # the model's title (capitalised)
    await html_until(comm, ">/echo charlie<")  # the fallback: the prompt's first words
    assert len(title_requests(recorded)) == 2
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo a fourth"}))
    refused = json.loads(await comm.receive_from(timeout=10))
    assert refused["type"] == "error" and refused["code"] == "rate_limited", refused
