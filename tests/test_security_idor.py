"""Authorisation: nobody reaches another user's conversations or messages, by URL or by socket.

Every URL of the chat that takes a conversation or message id is found from the URLconf (so a
view added later is checked too) and called with someone else's ids; every socket action is
sent with someone else's ids. All of them must answer "not found" and change nothing. Admin
pages are for staff only.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, get_resolver, reverse

from chat.ids import new_message_id
from chat.models import Conversation, Message
from tests.conftest import assistant_mid, receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")

# Form fields any chat POST might read; a view that ignores ownership would act on them.
POST_DATA = {
    "title": "pwned",
    "current": "",
    "tier": "full",
    "next": "/",
    "pinned": "1",
    "system_prompt": "pwned",
}


def chat_patterns_with_ids() -> list[URLPattern]:
    """Every URL pattern of the chat app whose path names a conversation or a message."""
    found = []
    for pattern in get_resolver().url_patterns:
        for inner in getattr(pattern, "url_patterns", [pattern]):
            if not isinstance(inner, URLPattern):
                continue
            names = set(inner.pattern.regex.groupindex)
            if names & {"conversation_id", "mid"}:
                found.append(inner)
    return found


def url_for(pattern: URLPattern, conversation: Conversation, mid: str) -> str:
    kwargs: dict[str, Any] = {}
    names = set(pattern.pattern.regex.groupindex)
    if "conversation_id" in names:
        kwargs["conversation_id"] = conversation.id
    if "mid" in names:
        kwargs["mid"] = mid
    return reverse(f"chat:{pattern.name}", kwargs=kwargs)


def make_conversation(user: Any, title: str) -> tuple[Conversation, Message, Message]:
    conversation = Conversation.objects.create(user=user, title=title)
    prompt = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        role=Message.Role.USER,
        text=f"the secret question of {user.username}",
    )
    answer = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        parent=prompt,
        role=Message.Role.ASSISTANT,
        text=f"the secret answer for {user.username}",
        status=Message.Status.COMPLETE,
    )
    Conversation.objects.filter(pk=conversation.pk).update(leaf=answer)
    conversation.refresh_from_db()
    return conversation, prompt, answer


def snapshot(user: Any) -> list[Any]:
    """Everything of a user's chats that a write could change."""
    conversations = list(
        Conversation.objects.filter(user=user).order_by("id").values().order_by("id")
    )
    messages = list(
        Message.objects.filter(conversation__user=user).order_by("id").values().order_by("id")
    )
    return [conversations, messages]


@pytest.mark.django_db
def test_the_id_taking_urls_are_all_found() -> None:
    # The test below is only as good as this list: the known views must be in it.
    names = {p.name for p in chat_patterns_with_ids()}
    assert {"conversation", "rename", "delete", "conversation_settings"} <= names


@pytest.mark.django_db
def test_every_view_with_an_id_answers_404_for_someone_elses_and_changes_nothing(
    owner: Any, other_user: Any
) -> None:
    mine, my_prompt, _ = make_conversation(owner, "mine")
    theirs, their_prompt, their_answer = make_conversation(other_user, "their secret plans")
    before = snapshot(other_user)
    client = Client()
    client.force_login(owner)
    patterns = chat_patterns_with_ids()
    for pattern in patterns:
        for mid in (their_answer.mid, their_prompt.mid):
            url = url_for(pattern, theirs, mid)
            get, post = client.get(url), client.post(url, POST_DATA, HTTP_HX_REQUEST="true")
            statuses = {get.status_code, post.status_code}
            # 404 for the method the view serves, 405 for the other; nothing else.
            assert statuses <= {404, 405} and 404 in statuses, (url, statuses)
            assert b"secret" not in get.content + post.content
        # Their message ids inside my own conversation are not found either.
        if "mid" in pattern.pattern.regex.groupindex:
            url = url_for(pattern, mine, their_answer.mid)
            assert client.post(url, POST_DATA).status_code in {404, 405}, url
    assert snapshot(other_user) == before
    # The control: the same requests on my own conversation are not refused as missing, so
    # the 404s above are about ownership, not about a malformed request.
    for pattern in sorted(patterns, key=lambda p: p.name == "delete"):  # delete goes last
        url = url_for(pattern, mine, my_prompt.mid)
        get, post = client.get(url), client.post(url, POST_DATA, HTTP_HX_REQUEST="true")
        assert 404 not in {get.status_code, post.status_code}, (url, get.status_code)


@pytest.mark.django_db
def test_the_conversation_list_and_its_search_show_only_my_conversations(
    owner: Any, other_user: Any
) -> None:
    make_conversation(owner, "mine about plans")
    theirs, _, _ = make_conversation(other_user, "their secret plans")
    client = Client()
    client.force_login(owner)
    for url in ("/", "/conversations/", "/conversations/?q=plans", "/conversations/?q=secret"):
        response = client.get(url)
        assert response.status_code == 200
        assert str(theirs.id) not in response.content.decode(), url
        assert "their secret" not in response.content.decode(), url
    # Searching message text finds only my own messages too.
    assert "mine about plans" in client.get("/conversations/?q=secret").content.decode()


@pytest.mark.django_db
def test_the_tier_choice_sets_only_a_cookie_and_never_redirects_off_site(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:x"):
        response = client.post("/tier/", {"tier": "lite", "next": target})
        assert response.status_code == 302
        assert response["Location"] == "/", target
    response = client.post("/tier/", {"tier": "lite", "next": "/conversations/"})
    assert response["Location"] == "/conversations/"
    assert response.cookies["chat_tier"].value == "lite"
    assert response.cookies["chat_tier"]["httponly"]


@pytest.mark.django_db
def test_pages_need_a_login(owner: Any) -> None:
    conversation, _, _ = make_conversation(owner, "mine")
    client = Client()
    for url in ("/", f"/c/{conversation.id}/", "/conversations/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(
            "/accounts/login/"
        ), url
    response = client.post(f"/c/{conversation.id}/delete/")
    assert response.status_code == 302
    assert Conversation.objects.filter(pk=conversation.pk).exists()


# --- the admin ----------------------------------------------------------------------------


def admin_urls(owner: Any, conversation: Conversation) -> list[str]:
    """The admin's index, every registered model's list, and change pages of real objects."""
    urls = ["/admin/"]
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        urls.append(reverse("admin:{}_{}_changelist".format(*info)))
    urls.append(reverse("admin:auth_user_change", args=[owner.pk]))
    urls.append(reverse("admin:chat_conversation_change", args=[conversation.pk]))
    return urls


@pytest.mark.django_db
def test_admin_pages_send_anonymous_and_non_staff_users_to_the_admin_login(
    owner: Any, other_user: Any
) -> None:
    conversation, _, _ = make_conversation(other_user, "their secret plans")
    anonymous, member = Client(), Client()
    member.force_login(owner)
    for url in admin_urls(other_user, conversation):
        for client in (anonymous, member):
            response = client.get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/"), url
    # A non-staff user cannot change anything through the admin either.
    response = member.post(
        reverse("admin:auth_user_change", args=[other_user.pk]), {"is_staff": "on"}
    )
    assert response.status_code == 302
    other_user.refresh_from_db()
    assert not other_user.is_staff


@pytest.mark.django_db
def test_staff_without_permissions_get_403_on_every_model_page(owner: Any, other_user: Any) -> None:
    conversation, _, _ = make_conversation(other_user, "their secret plans")
    get_user_model().objects.filter(pk=owner.pk).update(is_staff=True)
    client = Client()
    client.force_login(owner)
    for url in admin_urls(other_user, conversation)[1:]:
        assert client.get(url).status_code == 403, url
    index = client.get("/admin/")
    assert index.status_code == 200
    assert "their secret" not in index.content.decode()


# --- socket actions -----------------------------------------------------------------------


async def first_json(comm: Any) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{"):
            frame: dict[str, Any] = json.loads(raw)
            return frame


async def test_socket_actions_on_someone_elses_ids_are_not_found_and_change_nothing(
    connect: Any, owner: Any, other_user: Any
) -> None:
    mine, _, _ = await database_sync_to_async(make_conversation)(owner, "mine")
    theirs, their_prompt, their_answer = await database_sync_to_async(make_conversation)(
        other_user, "their secret plans"
    )
    before = await database_sync_to_async(snapshot)(other_user)
    my_count = await database_sync_to_async(Message.objects.filter(conversation=mine).count)()
    comm = await connect(owner)
    frames = [
        {"type": "prompt", "conversation": str(theirs.id), "text": "/echo in their chat"},
        {
            "type": "prompt",
            "conversation": str(theirs.id),
            "text": "/echo an edit",
            "replaces": their_prompt.mid,
        },
        {
            "type": "prompt",
            "conversation": str(mine.id),
            "text": "/echo their prompt as mine",
            "replaces": their_prompt.mid,
        },
        {"type": "stop", "mid": their_answer.mid},
        {"type": "resume", "mid": their_answer.mid, "after": -1},
        {"type": "regenerate", "mid": their_answer.mid},
        {"type": "regenerate", "mid": their_answer.mid, "model": "demo-lite"},
        {"type": "continue", "mid": their_answer.mid},
        {"\u0074ype": "\u0063ontinue", "mid": their_answer.mid},
    ]
    for frame in frames:
        await comm.send_to(text_data=json.dumps(frame))
        reply = await first_json(comm)
        assert reply["type"] == "error" and reply["code"] == "not_found", (frame, reply)
        assert "secret" not in json.dumps(reply)
    assert await database_sync_to_async(snapshot)(other_user) == before
    assert (
        await database_sync_to_async(Message.objects.filter(conversation=mine).count)() == my_count
    )
    # Nothing of theirs arrived on my socket, and it still works.
    await comm.send_to(
        text_data=json.dumps({"type": "prompt", "conversation": "", "text": "/echo ok"})
    )
    result = await receive_until_done(comm)
    assert result["text"] == "ok"
    assert not any("secret" in html for html in result["html"])


async def test_someone_else_cannot_stop_or_follow_a_streaming_answer(
    connect: Any, owner: Any, other_user: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    victim = await connect(other_user)
    await victim.send_to(
        text_data=json.dumps({"type": "prompt", "conversation": "", "text": "/long 80"})
    )
    mid = assistant_mid(await victim.receive_from(timeout=10))
    attacker = await connect(owner)
    for frame in (
        {"type": "stop", "mid": mid},
        {"type": "resume", "mid": mid, "after": -1},
        {"type": "regenerate", "mid": mid},
    ):
        await attacker.send_to(text_data=json.dumps(frame))
        reply = await first_json(attacker)
        assert reply["code"] == "not_found", (frame, reply)
    # The victim's answer was neither stopped nor copied: it completes, whole, for them only.
    result = await receive_until_done(victim, mid)
    assert result["done"]["status"] == "complete"
    assert len(result["text"].split()) == 80
    message = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert message.status == "complete"
    assert await attacker.receive_nothing(timeout=0.2)
