"""Edit and resend, regenerate, and switching between versions of a message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chat import branches
from chat import conversations as services
from chat.models import Conversation, Message
from tests.conftest import receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")


def texts(conversation: Conversation) -> list[str]:
    conversation.refresh_from_db()
    return [e.message.text for e in branches.thread(conversation)]


async def ask(comm: Any, text: str, conversation: str = "", **extra: Any) -> dict[str, Any]:
    frame = {"type": "prompt", "conversation": conversation, "text": text, **extra}
    await comm.send_to(text_data=json.dumps(frame))
    return await receive_until_done(comm)


async def test_editing_a_prompt_forks_the_conversation_and_keeps_the_old_branch(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    await ask(comm, "/echo one")
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    await ask(comm, "/echo two", str(conv.id))
    first_prompt = await database_sync_to_async(
        Message.objects.filter(conversation=conv, role="user").earliest
    )("created_at")
    edited = await ask(comm, "/echo uno", str(conv.id), replaces=first_prompt.mid)
    assert edited["text"] == "uno"
    # Only what changed is sent: the first prompt had no parent, so the page drops every
    # message (data-fork-after="") and appends the new version and its answer; the rest of
    # the old thread is not in the frame.
    assert 'data-fork-after=""' in edited["html"][0]
    assert "/echo uno" in edited["html"][0] and "/echo two" not in edited["html"][0]
    assert await database_sync_to_async(texts)(conv) == ["/echo uno", "uno"]
    # The old branch is still there, one click away.
    await database_sync_to_async(services.do_switch_version)(
        owner.pk, str(conv.id), first_prompt.mid
    )
    assert await database_sync_to_async(texts)(conv) == ["/echo one", "one", "/echo two", "two"]


async def test_regenerating_an_answer_adds_a_version_of_it(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    first = await ask(comm, "/echo same")
    await comm.send_to(text_data=json.dumps({"type": "regenerate", "mid": first["done"]["mid"]}))
    again = await receive_until_done(comm)
    assert again["done"]["mid"] != first["done"]["mid"]
    assert again["text"] == "same"
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    entries = await database_sync_to_async(branches.thread)(conv)
    answer = entries[-1]
    assert (answer.version, answer.versions) == (2, 2)
    assert answer.previous == first["done"]["mid"]


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "regenerate"},
        {"type": "regenerate", "mid": 5},
        {"type": "prompt", "conversation": "", "text": "hi", "replaces": "x"},
    ],
)
async def test_bad_edit_and_regenerate_frames_are_refused(
    connect: Any, owner: Any, frame: dict[str, Any]
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(frame))
    error = json.loads(await comm.receive_from(timeout=10))
    assert error["type"] == "error" and error["code"] == "bad_request"


async def test_nobody_can_regenerate_or_edit_someone_elses_messages(
    connect: Any, owner: Any, other_user: Any
) -> None:
    mine = await connect(owner)
    done = (await ask(mine, "/echo mine"))["done"]
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    theirs = await connect(other_user)
    await theirs.send_to(text_data=json.dumps({"type": "regenerate", "mid": done["mid"]}))
    assert json.loads(await theirs.receive_from(timeout=10))["code"] == "not_found"
    prompt = await database_sync_to_async(Message.objects.get)(conversation=conv, role="user")
    frame = {"type": "prompt", "conversation": str(conv.id), "text": "x", "replaces": prompt.mid}
    await theirs.send_to(text_data=json.dumps(frame))
    assert json.loads(await theirs.receive_from(timeout=10))["code"] == "not_found"


@pytest.mark.django_db
def test_the_version_arrows_switch_the_thread_over_http(owner: Any, other_user: Any) -> None:
    one = services.do_start_exchange(owner.pk, None, "/echo a", model="m", tier="full")
    conv = one.conversation
    services.do_finish_message(
        one.answer.mid,
        text="a",
        status="complete",
        error="",
        chunk_count=1,
        prompt_tokens=1,
        completion_tokens=1,
        usage_estimated=False,
        ttft_ms=1,
    )
    assert one.prompt is not None
    services.do_start_exchange(
        owner.pk, str(conv.id), "/echo b", model="m", tier="full", replaces=one.prompt.mid
    )
    client = Client()
    client.force_login(owner)
    response = client.post(f"/c/{conv.id}/versions/{one.prompt.mid}/")
    assert response.status_code == 200
    assert "/echo a" in response.content.decode()
    assert texts(conv)[0] == "/echo a"
    # Someone else's conversation: 404, and nothing changes.
    client.force_login(other_user)
    assert client.post(f"/c/{conv.id}/versions/{one.prompt.mid}/").status_code == 404


@pytest.mark.django_db
def test_an_edit_sends_only_its_own_branch_upstream(owner: Any) -> None:
    one = services.do_start_exchange(owner.pk, None, "first", model="m", tier="full")
    conv = one.conversation
    services.do_checkpoint(one.answer.mid, "answer one", 1)
    two = services.do_start_exchange(owner.pk, str(conv.id), "second", model="m", tier="full")
    assert [m["content"] for m in two.history] == ["first", "answer one", "second"]
    assert two.prompt is not None
    edit = services.do_start_exchange(
        owner.pk, str(conv.id), "second, edited", model="m", tier="full", replaces=two.prompt.mid
    )
    assert [m["content"] for m in edit.history] == ["first", "answer one", "second, edited"]
