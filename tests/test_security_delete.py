"""Deleting a conversation stops its running answer, wherever it runs (issue 13, finding 16).

The review deleted a conversation while its answer streamed: the upstream call and the stream
slot stayed, and Stop then answered `not_found`. Here on two real daphne instances sharing
PostgreSQL and Redis, the answer runs on web1 and the conversation is deleted on web2.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from tests.servers import signup
from tests.test_daphne import (
    PAIR_ENV,
    Answer,
    chat_socket,
    needs_postgres,
    new_username,
    next_json,
    query_one,
    read_answer,
    ready,
    send_prompt,
    two_instances,
)

pytestmark = needs_postgres


def streams_active(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^chat_streams_active (\S+)$", text, re.MULTILINE)
    assert match, "chat_streams_active is missing from /metrics"
    return float(match.group(1))


def delete_conversation(base: str, client: httpx.Client, conversation: str) -> int:
    """POST the sidebar's delete, as htmx does (the CSRF token in a header)."""
    response = httpx.post(
        f"{base}/c/{conversation}/delete/",
        cookies=client.cookies,
        headers={"X-CSRFToken": client.cookies["csrftoken"], "HX-Request": "true"},
        data={"current": ""},
        timeout=10,
    )
    return response.status_code


async def next_of_type(
    ws: ClientConnection, kind: str, answer: Answer | None = None
) -> dict[str, Any]:
    """The next JSON frame of type `kind`; frames of other types before it are skipped, but
    those of `answer` (chunks, its `done`) are added to it."""
    while (frame := await next_json(ws))["type"] != kind:
        if answer is not None and frame.get("mid") == answer.mid:
            if frame["type"] == "chunk":
                answer.chunks[frame["seq"]] = frame["text"]
            elif frame["type"] == "done":
                answer.done = frame
    return frame


@pytest.mark.timeout(180)
async def test_deleting_a_conversation_stops_its_answer_on_the_instance_running_it() -> None:
    # One stream at a time: an answer that kept its slot would refuse the next prompt.
    with two_instances(**{**PAIR_ENV, "CHAT_MAX_CONCURRENT_STREAMS": "1"}) as pair:
        client = await asyncio.to_thread(signup, pair.web1.base, new_username())
        async with chat_socket(pair.web1.base, client) as ws:
            await ready(ws)
            await send_prompt(ws, "/long 5000")  # 25 s unless stopped
            started = await read_answer(ws, until_chunks=2)
            row = query_one(
                pair.database_url,
                "SELECT conversation_id FROM chat_message WHERE mid = %s",
                started.mid,
            )
            assert row is not None
            # Deleted on the other instance, through the same view the sidebar posts to.
            assert (
                await asyncio.to_thread(delete_conversation, pair.web2.base, client, str(row[0]))
                == 200
            )
            # The tab (on web1) is told of the deletion made on web2, before or after the
            # answer's `done`: its page drops the conversation, and becomes a new chat if it
            # shows it (docs/protocol.md).
            told = await next_of_type(ws, "conversation_deleted", answer=started)
            assert told == {"type": "conversation_deleted", "conversation": str(row[0])}
            ended = await read_answer(ws, started, timeout=10)
            assert ended.done is not None and ended.done["status"] == "stopped"
            assert "deleted" in ended.done["error"]
            assert len(ended.text.split()) < 5000
            assert streams_active(pair.web1.base) == 0
            assert (
                query_one(
                    pair.database_url, "SELECT 1 FROM chat_message WHERE mid = %s", started.mid
                )
                is None
            )

            # A Stop for it now says what happened instead of a bare "not found".
            await ws.send(json.dumps({"type": "stop", "mid": started.mid}))
            error = await next_of_type(ws, "error")
            assert error["type"] == "error" and error["code"] == "not_found"
            assert "deleted" in error["message"] and error["mid"] == started.mid

            # The stream slot was released: the next prompt is answered at once.
            await send_prompt(ws, "/echo next")
            again = await read_answer(ws)
            assert again.errors == [], again.errors
            assert again.done is not None and again.done["status"] == "complete"
        client.close()
