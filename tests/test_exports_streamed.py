"""Exports stream (issue 19's review, finding 2): `/settings/export.json` and `/c/<id>/export.json`
are written as they are read, a bounded number of conversations and messages at a time, in the
exact JSON of before, and a person runs one export at a time (429 with a plain message)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import AsyncClient, Client
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import strategies as st

from chat import branches, conversations, exports
from chat.json_pieces import Items, pieces
from chat.limits.exports import running_exports
from chat.models import Message
from chat.sharing import EXPORT_BUSY
from tests.test_sharing import body, exchange, logged_in

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        | st.lists(inner, max_size=3).map(lambda items: Items(iter(items)))
    ),
    max_leaves=12,
)


def plain(value: Any) -> Any:
    if isinstance(value, Items):
        return [plain(v) for v in value.items]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@given(values)
def test_a_document_written_in_pieces_is_what_json_dumps_writes_whole(value: Any) -> None:
    # Drawn twice from one iterator would be empty: compare with a copy made first.
    whole = json.dumps(plain_copy := plain(value), ensure_ascii=False, indent=2)
    rebuilt = _with_items(plain_copy)
    assert "".join(pieces(rebuilt)) == whole


def _with_items(value: Any) -> Any:
    """Every list as Items again (the shape json_pieces streams)."""
    if isinstance(value, list):
        return Items(iter([_with_items(v) for v in value]))
    if isinstance(value, dict):
        return {k: _with_items(v) for k, v in value.items()}
    return value


def two_versions(user: Any, title: str) -> Any:
    conversation = exchange(user, title=title)
    first = branches.thread(conversation)[-1].message
    conversations.do_regenerate(user.pk, first.mid, model="demo-lite", tier="lite")
    Message.objects.filter(conversation=conversation, model="demo-lite").update(
        text="the other version", status=Message.Status.COMPLETE
    )
    conversations.do_switch_version(user.pk, str(conversation.id), first.mid)
    return conversation


@pytest.mark.django_db
def test_the_account_export_streams_a_few_rows_at_a_time_in_the_same_json(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exports, "MESSAGES_AT_ONCE", 2)
    monkeypatch.setattr(exports, "CONVERSATIONS_AT_ONCE", 2)
    made = [two_versions(owner, f"chat {i}") for i in range(5)]  # 3 messages each
    client = logged_in(owner)
    response = client.get("/settings/export.json")
    assert response.streaming and response["Content-Type"] == "application/json"
    with CaptureQueriesContext(connection) as queries:
        raw = body(response)
    document = json.loads(raw)
    # The same bytes json.dumps(indent=2) wrote for the whole document before.
    assert raw.decode() == json.dumps(document, ensure_ascii=False, indent=2)
    assert list(document) == [
        "format", "version", "exported_at", "user", "settings", "conversations", "feedback"
    ]  # fmt: skip
    by_id = {str(c.id): c for c in made}
    for record in document["conversations"]:
        assert list(record) == [
            "id", "title", "pinned", "model", "system_prompt", "created_at", "updated_at",
            "messages", "branch_on_show",
        ]  # fmt: skip
        conversation = by_id[record["id"]]
        every = conversation.messages.order_by("created_at", "id")
        assert [m["id"] for m in record["messages"]] == [m.mid for m in every]
        on_show = [e.message.mid for e in branches.thread(conversation)]
        assert record["branch_on_show"] == on_show
    assert len(document["conversations"]) == 5
    # Read as it was written: 15 messages two at a time, five conversations two at a time
    # (each batch with one query for its messages' outlines).
    rows = [q for q in queries.captured_queries if '"chat_message"."text"' in q["sql"]]
    # Batches of two conversations (6, 6 and 3 messages), their messages two at a time.
    assert len(rows) == 3 + 3 + 2
    outlines = [q for q in queries.captured_queries if "chat_message" in q["sql"]]
    assert len(outlines) == len(rows) + 3


@pytest.mark.django_db
def test_a_conversation_export_streams_its_branch_a_few_messages_at_a_time(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exports, "MESSAGES_AT_ONCE", 1)
    conversation = two_versions(owner, "one")
    response = logged_in(owner).get(f"/c/{conversation.id}/export.json")
    assert response.streaming
    with CaptureQueriesContext(connection) as queries:
        raw = body(response)
    document = json.loads(raw)
    assert raw.decode() == json.dumps(document, ensure_ascii=False, indent=2)
    on_show = [e.message.mid for e in branches.thread(conversation)]
    assert [m["id"] for m in document["conversation"]["messages"]] == on_show
    rows = [q for q in queries.captured_queries if '"chat_message"."text"' in q["sql"]]
    assert len(rows) == len(on_show)  # one message at a time


@pytest.mark.django_db
def test_a_second_export_while_one_runs_is_refused_with_a_plain_429(owner: Any) -> None:
    conversation = exchange(owner)
    client = logged_in(owner)
    first = client.get("/settings/export.json")  # started, not yet downloaded
    assert first.status_code == 200 and running_exports() == 1
    for url in ("/settings/export.json", f"/c/{conversation.id}/export.json"):
        refused = client.get(url)
        assert refused.status_code == 429
        assert refused["Content-Type"] == "text/plain; charset=utf-8"
        assert refused.content.decode() == EXPORT_BUSY and int(refused["Retry-After"]) > 0
    json.loads(body(first))  # the first one downloads whole …
    assert running_exports() == 0  # … and gives its place back
    again = client.get("/settings/export.json")
    assert again.status_code == 200 and json.loads(body(again))["conversations"]
    # A download abandoned unread gives its place back when Django closes the response.
    abandoned = client.get("/settings/export.json")
    abandoned.close()
    assert running_exports() == 0


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_under_asgi_the_export_is_an_async_stream(owner: Any) -> None:
    from channels.db import database_sync_to_async

    await database_sync_to_async(exchange)(owner)
    client = AsyncClient()
    await client.aforce_login(owner)
    response = await client.get("/settings/export.json")
    assert response.streaming and response.is_async
    parts = [part async for part in response.streaming_content]
    assert json.loads(b"".join(parts))["conversations"][0]["title"] == "Rainbows"
    assert await database_sync_to_async(running_exports)() == 0


@pytest.mark.django_db
def test_someone_elses_conversation_is_not_exported_and_holds_no_place(
    owner: Any, other_user: Any
) -> None:
    conversation = exchange(owner)
    assert logged_in(other_user).get(f"/c/{conversation.id}/export.json").status_code == 404
    assert running_exports() == 0
    assert Client().get("/settings/export.json").status_code == 302
