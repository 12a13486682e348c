"""Server restart mid-answer: a real daphne is killed (SIGKILL) while it streams, then restarted.

The answer keeps the text of its last checkpoint and is marked `failed` — by the instance
itself when it comes back (it owned the answer, so the answer cannot still be running), or
by any other instance once the dead one's lease runs out. It is never left `streaming`, and
the user can ask again in the same conversation.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from chat.demo_upstream import long_tokens
from tests.conftest import assistant_mid
from tests.servers import free_port, migrated_sqlite, running_chatsite, signup

# 50 tokens/s: a /long 1000 answer would take 20 s, so it is surely cut mid-way.
SLOW = {"DEMO_TOKENS_PER_SECOND": "50", "DEMO_TTFB_MS": "0", "CHAT_CHECKPOINT_SECONDS": "0.5"}


def daphne_pid(port: int) -> int:
    """The pid of the daphne serving `port` (running_chatsite keeps its Popen to itself)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"daphne") for a in args) and str(port).encode() in args:
            return int(entry.name)
    raise LookupError(f"no daphne on port {port}")


def message_row(db_url: str, mid: str) -> dict[str, Any]:
    """The message as the database has it, read straight from the server's SQLite file."""
    with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=10) as db:
        db.row_factory = sqlite3.Row
        row = db.execute(
            "SELECT status, text, error, conversation_id FROM chat_message WHERE mid = ?", (mid,)
        ).fetchone()
    return dict(row)


async def wait_for_row(
    db_url: str, mid: str, status: str, *, poke: str = "", session: str = ""
) -> dict[str, Any]:
    """Wait (at most 15 s) until the message has `status`, GETting `poke` meanwhile if given."""
    async with asyncio.timeout(15), httpx.AsyncClient(cookies={"sessionid": session}) as http:
        while (row := message_row(db_url, mid))["status"] != status:
            if poke:
                await http.get(poke)
            await asyncio.sleep(0.1)
    return row


def open_socket(base: str, session: str) -> Any:
    return ws_connect(
        base.replace("http://", "ws://") + "/ws/chat/",
        origin=base,  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={session}"},
        open_timeout=10,
    )


async def json_frame(socket: ClientConnection) -> dict[str, Any]:
    while True:
        raw = await asyncio.wait_for(socket.recv(), 10)
        assert isinstance(raw, str)
        if raw.startswith("{"):
            frame: dict[str, Any] = json.loads(raw)
            return frame


async def stream_then_kill(base: str, session: str, port: int, db_url: str) -> tuple[str, str]:
    """Ask for a long answer, read a second and a half of it, SIGKILL the server mid-answer.

    Returns the answer's mid and what the socket had received by then.
    """
    async with open_socket(base, session) as socket:
        assert (await json_frame(socket))["type"] == "ready"
        await socket.send(json.dumps({"type": "prompt", "conversation": "", "text": "/long 1000"}))
        while True:
            raw = await asyncio.wait_for(socket.recv(), 10)
            if isinstance(raw, str) and 'class="msg msg-assistant"' in raw:
                mid = assistant_mid(raw)
                break
        received = ""
        while len(received.split()) < 75:  # 1.5 s: past at least two checkpoints
            frame = await json_frame(socket)
            if frame["type"] == "chunk" and frame["mid"] == mid:
                received += frame["text"]
        # The checkpoint is in the database while it streams.
        assert message_row(db_url, mid)["status"] == "streaming"
        os.kill(daphne_pid(port), signal.SIGKILL)
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(socket.recv(), 10)
    return mid, received


async def ask_again(base: str, session: str, conversation: str) -> dict[str, Any]:
    async with open_socket(base, session) as socket:
        assert (await json_frame(socket))["type"] == "ready"
        frame = {"type": "prompt", "conversation": conversation, "text": "/echo second try"}
        await socket.send(json.dumps(frame))
        while (done := await json_frame(socket))["type"] != "done":
            pass
        return done


def check_interrupted(row: dict[str, Any], received: str) -> None:
    expected = "".join(long_tokens(1000))
    # The last checkpoint's text: a non-empty prefix of the answer, no more than was sent.
    assert row["text"] and expected.startswith(row["text"])
    assert received.startswith(row["text"])
    assert "interrupted" in row["error"]


@pytest.mark.timeout(120)
async def test_an_answer_cut_by_a_restart_is_failed_with_its_checkpoint_and_can_be_retried(
    tmp_path: Path,
) -> None:
    db_url = migrated_sqlite(tmp_path)
    port = free_port()
    env = {**SLOW, "CHAT_INSTANCE_ID": "restart1"}
    with running_chatsite(database_url=db_url, port=port, **env) as base:
        client = signup(base, "restarter")
        session = client.cookies["sessionid"]
        mid, received = await stream_then_kill(base, session, port, db_url)
    # The same instance comes back (same id, same database): its start-up marks the answer.
    with running_chatsite(database_url=db_url, port=port, **env) as base:
        row = await wait_for_row(db_url, mid, "failed")
        check_interrupted(row, received)
        conversation = str(uuid.UUID(row["conversation_id"]))  # SQLite keeps 32 hex digits
        async with httpx.AsyncClient(cookies={"sessionid": session}) as http:
            page = (await http.get(f"{base}/c/{conversation}/")).text
        article = re.search(rf'<article[^>]*id="msg-{re.escape(mid)}"[^>]*>', page)
        assert article and 'data-status="failed"' in article.group(0)
        done = await ask_again(base, session, conversation)
        assert done["status"] == "complete"
    client.close()


@pytest.mark.timeout(120)
async def test_an_answer_whose_instance_never_returns_is_failed_by_another_when_its_lease_ends(
    tmp_path: Path,
) -> None:
    db_url = migrated_sqlite(tmp_path)
    port = free_port()
    with running_chatsite(
        database_url=db_url, port=port, CHAT_INSTANCE_ID="web1", CHAT_LEASE_SECONDS="1", **SLOW
    ) as base:
        client = signup(base, "orphaned")
        session = client.cookies["sessionid"]
        mid, received = await stream_then_kill(base, session, port, db_url)
    # Another instance (another id) serves the conversation: once web1's lease has run out,
    # any read of the conversation marks the orphan.
    with running_chatsite(database_url=db_url, CHAT_INSTANCE_ID="web2", **SLOW) as base:
        conversation = str(uuid.UUID(message_row(db_url, mid)["conversation_id"]))
        page = f"{base}/c/{conversation}/"
        row = await wait_for_row(db_url, mid, "failed", poke=page, session=session)
        check_interrupted(row, received)
        done = await ask_again(base, session, conversation)
        assert done["status"] == "complete"
    client.close()
