"""The conversation list over HTTP: pages, search, pin, rename, delete — each only your own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from chat.models import Conversation, Message


@pytest.fixture
def client_of(owner: Any) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.mark.django_db
def test_the_chat_pages_need_a_login() -> None:
    for url in ("/", "/conversations/"):
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_the_list_pages_through_long_histories(client_of: Client, owner: Any) -> None:
    for i in range(120):
        Conversation.objects.create(user=owner, title=f"chat {i:03d}")
    first = client_of.get("/conversations/").content.decode()
    assert first.count('<li id="conv-') == 50
    assert "offset=50" in first and 'hx-trigger="intersect once"' in first
    last = client_of.get("/conversations/?offset=100").content.decode()
    assert last.count('<li id="conv-') == 20
    assert "Load older" not in last


@pytest.mark.django_db
def test_search_finds_titles_and_message_text(
    client_of: Client, owner: Any, other_user: Any
) -> None:
    a = Conversation.objects.create(user=owner, title="Trip to Lisbon")
    b = Conversation.objects.create(user=owner, title="Untitled")
    Message.objects.create(mid="1-t-01", conversation=b, role="user", text="pastel de nata recipe")
    Conversation.objects.create(user=other_user, title="Lisbon secrets")
    assert "Trip to Lisbon" in client_of.get("/conversations/?q=lisbon").content.decode()
    assert "Lisbon secrets" not in client_of.get("/conversations/?q=lisbon").content.decode()
    found = client_of.get("/conversations/?q=nata").content.decode()
    assert f"conv-{b.id}" in found and f"conv-{a.id}" not in found
    assert "No conversation matches" in client_of.get("/conversations/?q=zzz").content.decode()


@pytest.mark.django_db
def test_pinned_conversations_come_first(client_of: Client, owner: Any) -> None:
    old = Conversation.objects.create(user=owner, title="old one")
    Conversation.objects.create(user=owner, title="new one")
    listing = client_of.post(f"/c/{old.id}/pin/").content.decode()
    assert listing.index("old one") < listing.index("new one")
    listing = client_of.post(f"/c/{old.id}/pin/").content.decode()
    assert listing.index("new one") < listing.index("old one")


@pytest.mark.django_db
def test_rename_and_delete_work_on_your_own_and_404_on_anyone_elses(
    client_of: Client, owner: Any, other_user: Any
) -> None:
    mine = Conversation.objects.create(user=owner, title="mine")
    theirs = Conversation.objects.create(user=other_user, title="theirs")
    renamed = client_of.post(f"/c/{mine.id}/rename/", {"title": "  <b>new</b>  name "})
    assert renamed.status_code == 200
    assert "&lt;b&gt;new&lt;/b&gt; name" in renamed.content.decode()
    assert client_of.post(f"/c/{mine.id}/rename/", {"title": " "}).status_code == 400
    for url in (f"/c/{theirs.id}/", f"/c/{theirs.id}/rename/", f"/c/{theirs.id}/delete/"):
        method = client_of.get if url.endswith(f"{theirs.id}/") else client_of.post
        assert method(url, {"title": "x"} if "rename" in url else {}).status_code == 404
    assert client_of.post(f"/c/{theirs.id}/pin/").status_code == 404
    theirs.refresh_from_db()
    assert (theirs.title, theirs.pinned) == ("theirs", False)
    deleted = client_of.post(f"/c/{mine.id}/delete/", {"current": str(mine.id)})
    # The page showing it becomes a new chat (sidebar.js replaces its history entry).
    assert json.loads(deleted["HX-Trigger"]) == {"open-conversation-deleted": {}}
    assert not Conversation.objects.filter(pk=mine.pk).exists()


@pytest.mark.django_db
def test_a_conversation_page_shows_its_history_rendered(client_of: Client, owner: Any) -> None:
    conv = Conversation.objects.create(user=owner, title="history")
    prompt = Message.objects.create(mid="1-t-01", conversation=conv, role="user", text="<hi>")
    Message.objects.create(
        mid="2-t-01",
        conversation=conv,
        parent=prompt,
        role="assistant",
        text="**bold**",
        status="complete",
        model="demo-full",
        tier="full",
    )
    page = client_of.get(f"/c/{conv.id}/").content.decode()
    assert "&lt;hi&gt;" in page
    assert "<strong>bold</strong>" in page
    assert 'data-mid="2-t-01"' in page and 'data-status="complete"' in page
