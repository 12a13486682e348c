"""Custom instructions (/settings/) and a conversation's system prompt (/c/<id>/settings/):
CSRF-protected forms, owner only, sent upstream as the first `system` message (issue 17.2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chat import conversations
from chat.forms import MAX_INSTRUCTIONS_CHARS
from chat.limits.budget import prompt_tokens
from chat.models import Conversation, Preferences
from tests.conftest import receive_until_done
from tests.recording_upstream import Recorded, recording_upstream

pytestmark = pytest.mark.usefixtures("chat_settings")


@pytest.fixture
def recorded(chat_settings: Any, demo_upstream: str) -> Iterator[Recorded]:
    with recording_upstream(demo_upstream) as (url, seen):
        chat_settings.LLM_BASE_URL = url
        yield seen


def logged_in(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_settings_page_shows_and_saves_the_instructions(owner: Any) -> None:
    client = logged_in(owner)
    page = client.get("/settings/")
    assert page.status_code == 200
    assert b'name="instructions"' in page.content
    saved = client.post("/settings/", {"instructions": "  Answer in French.  "})
    assert saved.status_code == 200 and b"Saved." in saved.content
    assert Preferences.objects.get(user=owner).instructions == "Answer in French."
    assert b"Answer in French." in client.get("/settings/").content


@pytest.mark.django_db
def test_instructions_over_the_limit_are_refused_with_words(owner: Any) -> None:
    client = logged_in(owner)
    response = client.post("/settings/", {"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)})
    assert response.status_code == 400
    assert b"at most" in response.content
    assert not Preferences.objects.filter(user=owner).exists()


@pytest.mark.django_db
def test_both_forms_need_the_csrf_token(owner: Any) -> None:
    conv = Conversation.objects.create(user=owner, title="t")
    client = logged_in(owner, csrf=True)
    assert client.post("/settings/", {"instructions": "x"}).status_code == 403
    assert client.post(f"/c/{conv.id}/settings/", {"system_prompt": "x"}).status_code == 403
    assert not Preferences.objects.filter(user=owner).exists()
    conv.refresh_from_db()
    assert conv.system_prompt == ""


@pytest.mark.django_db
def test_settings_need_a_login() -> None:
    response = Client().get("/settings/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.django_db
def test_the_conversation_system_prompt_is_saved_by_its_owner_only(
    owner: Any, other_user: Any
) -> None:
    conv = Conversation.objects.create(user=owner, title="mine")
    response = logged_in(other_user).post(f"/c/{conv.id}/settings/", {"system_prompt": "pwned"})
    assert response.status_code == 404
    saved = logged_in(owner).post(
        f"/c/{conv.id}/settings/", {"system_prompt": "Be brief."}, HTTP_HX_REQUEST="true"
    )
    assert saved.status_code == 200 and b"Saved." in saved.content
    conv.refresh_from_db()
    assert conv.system_prompt == "Be brief."


@pytest.mark.django_db
def test_the_system_message_comes_first_and_counts_in_the_prompt_estimate(owner: Any) -> None:
    Preferences.objects.create(user=owner, instructions="Answer in French.")
    exchange = conversations.do_start_exchange(
        owner.pk, None, "hello", model="demo-full", tier="full"
    )
    conv = exchange.conversation
    conv.system_prompt = "Be brief."
    conv.save()
    second = conversations.do_start_exchange(
        owner.pk, str(conv.id), "again", model="demo-full", tier="full"
    )
    system = second.history[0]
    assert system == {"role": "system", "content": "Answer in French.\n\nBe brief."}
    without = [m for m in second.history if m["role"] != "system"]
    # What the turn reserves and fits (chat.limits.budget) counts the system message too.
    assert prompt_tokens(second.history) > prompt_tokens(without)


async def test_instructions_and_system_prompt_reach_the_upstream_first(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    await database_sync_to_async(Preferences.objects.create)(
        user=owner, instructions="Answer in French."
    )
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo-system"}))
    first = await receive_until_done(comm)
    assert first["text"] == "Answer in French."
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    conv.system_prompt = "Be brief."
    await database_sync_to_async(conv.save)()
    frame = {"type": "prompt", "conversation": str(conv.id), "text": "/echo-system"}
    await comm.send_to(text_data=json.dumps(frame))
    second = await receive_until_done(comm)
    # The user's instructions first, then the conversation's own.
    assert second["text"] == "Answer in French.\n\nBe brief."
    messages = recorded.snapshot()[-1]["messages"]
    assert messages[0] == {"role": "system", "content": "Answer in French.\n\nBe brief."}
    assert [m["role"] for m in messages].count("system") == 1


async def test_without_instructions_no_system_message_is_sent(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo-system"}))
    result = await receive_until_done(comm)
    assert result["text"] == "There is no system message."
    assert all(m["role"] != "system" for m in recorded.snapshot()[0]["messages"])
