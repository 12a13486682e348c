"""HTML in fields users control (titles, usernames, plan names, messages) is shown, not run.

Each page and frame that shows such a field is fetched with markup in it; the markup must
arrive escaped (the escaped form is there, the live form is not).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat.ids import new_message_id
from chat.models import Conversation, Message, Plan, Quota, Usage
from chat.rendering import LiveRenderer
from tests.conftest import receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>\'"&'
EVIL_USERNAME = "<b onmouseover=alert(1)>bob</b>"  # create_user skips the form's validator
LIVE = ("<script>alert(", "<img src=x", "<b onmouseover")


def assert_escaped(html: str, where: str, *, shown: bool = True) -> None:
    for fragment in LIVE:
        assert fragment not in html, f"{fragment!r} reached {where} unescaped"
    if shown:  # the field was on the page at all, so the check above meant something
        assert "&lt;script&gt;" in html or "&lt;b onmouseover" in html, f"not shown in {where}"


@pytest.fixture
def evil_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(EVIL_USERNAME, password="x-long-pass-123456")


def evil_conversation(user: Any) -> Conversation:
    conversation = Conversation.objects.create(user=user, title=EVIL)
    prompt = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        role=Message.Role.USER,
        text=EVIL,
    )
    answer = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        parent=prompt,
        role=Message.Role.ASSISTANT,
        text=EVIL,
        status=Message.Status.FAILED,
        error=EVIL,  # upstream error texts are shown too, and come from another server
    )
    Conversation.objects.filter(pk=conversation.pk).update(leaf=answer)
    return conversation


@pytest.mark.django_db
def test_titles_usernames_and_messages_are_escaped_in_the_chat_pages(evil_user: Any) -> None:
    conversation = evil_conversation(evil_user)
    client = Client()
    client.force_login(evil_user)
    for url in (
        "/",
        f"/c/{conversation.id}/",
        "/conversations/",
        "/conversations/?q=" + "<script>alert(1)</script>",  # the "no match" line quotes it
    ):
        response = client.get(url)
        assert response.status_code == 200
        assert_escaped(response.content.decode(), url)
    renamed = client.post(f"/c/{conversation.id}/rename/", {"title": EVIL + "2", "current": ""})
    assert renamed.status_code == 200
    assert_escaped(renamed.content.decode(), "the rename answer")


@pytest.mark.django_db
def test_the_current_id_the_sidebar_writes_back_is_an_id_or_refused(evil_user: Any) -> None:
    """The sidebar repeats `current` in three fields of every entry: 200 KB of quotes came
    back as 21.6 MB (hostile review). Anything but a conversation id is refused, before the
    pin or the rename is made."""
    conversation = evil_conversation(evil_user)
    client = Client()
    client.force_login(evil_user)
    flood = '"' * 200_000
    headers = {"HX-Request": "true"}
    pinned = client.post(f"/c/{conversation.id}/pin/", {"current": flood}, headers=headers)
    assert pinned.status_code == 400
    assert len(pinned.content) < 5_000
    assert b"must be a conversation" in pinned.content
    renamed = client.post(
        f"/c/{conversation.id}/rename/", {"title": "kept?", "current": EVIL}, headers=headers
    )
    assert renamed.status_code == 400
    listed = client.get("/conversations/", {"current": "x&q=injected"}, headers=headers)
    assert listed.status_code == 400
    conversation.refresh_from_db()
    assert not conversation.pinned and conversation.title != "kept?"
    # An id (in any spelling UUID accepts) is written back as the sidebar writes ids.
    spelled = str(conversation.id).upper()
    pinned = client.post(f"/c/{conversation.id}/pin/", {"current": spelled}, headers=headers)
    assert pinned.status_code == 200
    assert f'value="{conversation.id}"' in pinned.content.decode()
    assert 'aria-current="page"' in pinned.content.decode()


@pytest.mark.django_db
def test_user_controlled_fields_are_escaped_in_the_admin(
    evil_user: Any, django_user_model: Any
) -> None:
    conversation = evil_conversation(evil_user)
    plan = Plan.objects.create(name=EVIL)
    Quota.objects.update_or_create(user=evil_user, defaults={"plan": plan})
    Usage.objects.create(
        user=evil_user, tier="full", model=EVIL, requests=1, prompt_tokens=1, completion_tokens=1
    )
    answer = Message.objects.filter(conversation=conversation, role="assistant").get()
    admin_user = django_user_model.objects.create_superuser("root", password="x-long-pass-1")
    client = Client()
    client.force_login(admin_user)
    # The index shows only the site's totals: nothing user-named, but nothing live either.
    assert_escaped(client.get("/admin/").content.decode(), "/admin/", shown=False)
    for url in (
        reverse("admin:auth_user_changelist"),
        reverse("admin:auth_user_change", args=[evil_user.pk]),
        reverse("admin:chat_plan_changelist"),
        reverse("admin:chat_plan_change", args=[plan.pk]),
        reverse("admin:chat_conversation_changelist"),
        reverse("admin:chat_conversation_change", args=[conversation.pk]),
        reverse("admin:chat_message_change", args=[answer.pk]),
        reverse("admin:chat_usage_changelist"),
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        assert_escaped(response.content.decode(), url)


async def test_markup_in_a_prompt_is_escaped_in_every_frame(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    # The prompt becomes the user's bubble and the new conversation's title in the sidebar;
    # the answer echoes it as markdown (sanitised by the renderer).
    text = "/echo " + EVIL
    await comm.send_to(text_data=json.dumps({"type": "prompt", "conversation": "", "text": text}))
    result = await receive_until_done(comm)
    assert result["done"]["status"] == "complete"
    assert result["html"], "no HTML frames came"
    for html in result["html"]:
        for fragment in LIVE:
            assert fragment not in html
    assert "&lt;script&gt;" in result["html"][0]
    title = await database_sync_to_async(lambda: Conversation.objects.get(user=owner).title)()
    assert title.startswith("/echo <script>")  # stored as typed, escaped only on output


def test_markup_in_an_answer_is_escaped_in_every_block_rendered_while_it_streams() -> None:
    # The live renderer sends each block as HTML before the answer is done: markup in any
    # kind of block is text there too, whether the answer came whole or a character at a time.
    answer = (
        f"# {EVIL}\n\n{EVIL}\n\n- {EVIL}\n- **{EVIL}**\n\n> {EVIL}\n\n| {EVIL} | x |\n|---|---|\n"
        f"| `{EVIL}` | y |\n\n```html\n{EVIL}\n```\n\n$\\text{{{EVIL}}}$\n\n$$\n{EVIL}\n$$\n"
    )
    for pieces in ([answer], list(answer)):
        renderer = LiveRenderer()
        blocks = [block for piece in pieces for block in renderer.feed(piece)]
        assert len(blocks) >= 7  # all but the last came out mid-stream
        for block in blocks + renderer.finish():
            # Highlighted code and MathML split the text into spans: "shown" is checked once,
            # on the whole answer.
            assert_escaped(block.html, f"live block {block.index}", shown=False)
        assert_escaped(renderer.final_html(), "the answer's final HTML")


@pytest.mark.django_db
def test_a_username_with_markup_cannot_be_chosen_at_signup() -> None:
    client = Client()
    response = client.post(
        "/accounts/signup/",
        {"username": EVIL_USERNAME, "password1": "a-long-pass-42x", "password2": "a-long-pass-42x"},
    )
    assert response.status_code == 200  # the form again, with an error
    assert not get_user_model().objects.filter(username=EVIL_USERNAME).exists()
    assert_escaped(response.content.decode(), "the signup form")
