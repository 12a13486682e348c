"""Export and share (issue 17.6): the branch on show as Markdown and JSON, all of a person's
data, a read-only snapshot anyone with the link can read; only the owner exports or shares."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat import branches, conversations
from chat.ids import new_message_id
from chat.models import Conversation, Feedback, Message, SharedConversation

pytestmark = pytest.mark.django_db


def exchange(user: Any, title: str = "Rainbows", answer: str = "Light **bends**.") -> Conversation:
    conversation = Conversation.objects.create(user=user, title=title)
    prompt = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        role=Message.Role.USER,
        text="How do rainbows form? <script>alert(1)</script>",
    )
    reply = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        parent=prompt,
        role=Message.Role.ASSISTANT,
        text=answer,
        html=f"<p>{answer.replace('**bends**', '<strong>bends</strong>')}</p>",
        status=Message.Status.COMPLETE,
        model="demo-full",
        tier="full",
        prompt_tokens=12,
        completion_tokens=34,
    )
    Conversation.objects.filter(pk=conversation.pk).update(leaf=reply)
    conversation.refresh_from_db()
    return conversation


def body(response: Any) -> bytes:
    """A download's bytes: the JSON exports stream (issue 19's review, finding 2)."""
    if response.streaming:
        return b"".join(response.streaming_content)
    return bytes(response.content)


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_markdown_export_is_a_download_of_the_branch_on_show(owner: Any) -> None:
    conversation = exchange(owner)
    # Another version of the answer, not on show: not exported.
    first = branches.thread(conversation)[-1].message
    conversations.do_regenerate(owner.pk, first.mid, model="demo-lite", tier="lite")
    Message.objects.filter(conversation=conversation, model="demo-lite").update(
        text="the other version", status=Message.Status.COMPLETE
    )
    conversations.do_switch_version(owner.pk, str(conversation.id), first.mid)
    response = logged_in(owner).get(f"/c/{conversation.id}/export.md")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="rainbows-')
    text = response.content.decode()
    assert text.startswith("# Rainbows\n")
    assert "## You" in text and "How do rainbows form?" in text
    assert "## Assistant · demo-full · full tier · 12 tokens in, 34 out" in text
    assert "Light **bends**." in text  # the answer as the model wrote it
    assert "the other version" not in text


def test_json_export_has_model_tier_times_and_usage_per_message(owner: Any) -> None:
    conversation = exchange(owner)
    response = logged_in(owner).get(f"/c/{conversation.id}/export.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "attachment" in response["Content-Disposition"]
    document = json.loads(body(response))
    exported = document["conversation"]
    assert exported["id"] == str(conversation.id) and exported["title"] == "Rainbows"
    prompt, answer = exported["messages"]
    assert prompt["role"] == "user" and prompt["created_at"]
    assert answer["model"] == "demo-full" and answer["tier"] == "full"
    assert answer["usage"] == {"prompt_tokens": 12, "completion_tokens": 34, "estimated": False}
    assert answer["created_at"] and answer["status"] == "complete"


def test_the_account_export_holds_every_conversation_and_vote_in_fixed_queries(
    owner: Any, other_user: Any
) -> None:
    client = logged_in(owner)
    counts = []
    for n in (1, 6):
        Conversation.objects.filter(user=owner).delete()
        for i in range(n):
            exchange(owner, title=f"mine {i}")
        body(client.get("/settings/export.json"))  # warm: the first reads the plan and tiers
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/settings/export.json")
            document = json.loads(body(response))  # the queries run as it streams
        counts.append(len(queries))
        assert len(document["conversations"]) == n
    assert counts[0] == counts[1], counts  # not a query per conversation
    exchange(other_user, title="their secret")
    answer = Message.objects.filter(conversation__user=owner, role="assistant").first()
    assert answer is not None
    Feedback.objects.create(message=answer, user=owner, vote="down", comment="meh")
    response = client.get("/settings/export.json")
    assert "attachment" in response["Content-Disposition"]
    text = body(response).decode()
    document = json.loads(text)
    assert document["user"]["username"] == "owner"
    assert "their secret" not in text
    assert document["feedback"][0]["comment"] == "meh"
    assert Client().get("/settings/export.json").status_code == 302  # to the login


def test_the_account_export_holds_every_branch_the_instructions_and_each_chats_settings(
    owner: Any,
) -> None:
    client = logged_in(owner)
    conversation = exchange(owner)
    # Set as the person sets them: custom instructions, the chat's system prompt.
    assert client.post("/settings/", {"instructions": "Answer in French."}).status_code in (
        200,
        302,
    )
    settings_url = f"/c/{conversation.id}/settings/"
    assert client.post(settings_url, {"system_prompt": "Be brief."}).status_code in (200, 302)
    Conversation.objects.filter(pk=conversation.pk).update(model="demo-lite")  # as picked
    # A second version of the answer; the first is put back on show.
    first = branches.thread(conversation)[-1].message
    conversations.do_regenerate(owner.pk, first.mid, model="demo-lite", tier="lite")
    Message.objects.filter(conversation=conversation, model="demo-lite").update(
        text="the other version", status=Message.Status.COMPLETE
    )
    conversations.do_switch_version(owner.pk, str(conversation.id), first.mid)

    document = json.loads(body(client.get("/settings/export.json")))
    assert document["settings"] == {"instructions": "Answer in French."}
    [exported] = document["conversations"]
    assert exported["system_prompt"] == "Be brief." and exported["model"] == "demo-lite"
    by_id = {m["id"]: m for m in exported["messages"]}
    prompt = next(m for m in exported["messages"] if m["role"] == "user")
    answers = [m for m in exported["messages"] if m["role"] == "assistant"]
    # Both versions, each under the prompt it answers; the branch on show names the first.
    assert sorted(a["text"] for a in answers) == ["Light **bends**.", "the other version"]
    assert all(a["parent"] == prompt["id"] for a in answers) and prompt["parent"] is None
    assert exported["branch_on_show"] == [prompt["id"], first.mid]
    assert set(exported["branch_on_show"]) <= set(by_id)
    # A conversation's own export stays the branch on show.
    own = json.loads(body(client.get(f"/c/{conversation.id}/export.json")))["conversation"]
    assert [m["id"] for m in own["messages"]] == exported["branch_on_show"]
    assert own["system_prompt"] == "Be brief."


def test_share_makes_a_public_noindex_snapshot_and_unshare_makes_it_404(owner: Any) -> None:
    conversation = exchange(owner)
    client = logged_in(owner)
    response = client.post(f"/c/{conversation.id}/share/")
    assert response.status_code == 302
    path = response["Location"]
    assert re.fullmatch(r"/s/[A-Za-z0-9_-]{43}/", path)
    # htmx gets the link in the body; sharing again keeps the link (and updates the snapshot).
    Message.objects.filter(conversation=conversation, role="assistant").update(
        html="<p>updated</p>"
    )
    again = client.post(f"/c/{conversation.id}/share/", HTTP_HX_REQUEST="true")
    assert path in again.content.decode()
    page = Client().get(path)  # logged out
    assert page.status_code == 200
    assert page["X-Robots-Tag"].startswith("noindex")
    assert page["Cache-Control"] == "private, no-store"
    html = page.content.decode()
    assert "<p>updated</p>" in html  # the stored, sanitised HTML of the answer
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # a prompt is text, escaped
    assert "<script>alert" not in html
    assert '<meta name="robots" content="noindex' in html
    # A message sent after sharing is not in the snapshot.
    conversations.do_start_exchange(
        owner.pk, str(conversation.id), "later secret", model="m", tier="full"
    )
    assert "later secret" not in Client().get(path).content.decode()
    assert client.post(f"/c/{conversation.id}/unshare/").status_code == 302
    assert Client().get(path).status_code == 404
    assert not SharedConversation.objects.exists()
    # Sharing again makes a new link; the old one stays dead.
    new_path = client.post(f"/c/{conversation.id}/share/")["Location"]
    assert new_path != path and Client().get(path).status_code == 404


def test_nobody_but_the_owner_exports_or_shares(owner: Any, other_user: Any) -> None:
    conversation = exchange(owner)
    thief = logged_in(other_user)
    for url in (f"/c/{conversation.id}/export.md", f"/c/{conversation.id}/export.json"):
        assert thief.get(url).status_code == 404
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    for url in (f"/c/{conversation.id}/share/", f"/c/{conversation.id}/unshare/"):
        assert thief.post(url).status_code == 404
        response = Client().post(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert not SharedConversation.objects.exists()
    # The owner's share cannot be stopped by anyone else either.
    path = logged_in(owner).post(f"/c/{conversation.id}/share/")["Location"]
    assert thief.post(f"/c/{conversation.id}/unshare/").status_code == 404
    assert Client().get(path).status_code == 200


def test_guessed_or_malformed_tokens_are_not_found(owner: Any) -> None:
    for token in ("x", "a" * 43, "a" * 500, "..", "%2e%2e"):
        assert Client().get(f"/s/{token}/").status_code == 404, token


def test_share_and_unshare_need_the_csrf_token(owner: Any) -> None:
    conversation = exchange(owner)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(f"/c/{conversation.id}/share/").status_code == 403
    assert not SharedConversation.objects.exists()
    logged_in(owner).post(f"/c/{conversation.id}/share/")
    assert client.post(f"/c/{conversation.id}/unshare/").status_code == 403
    assert SharedConversation.objects.exists()
