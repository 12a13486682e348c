"""Server restart mid-answer: a real daphne is killed (SIGKILL) while it streams, then restarted.

The answer keeps its text and is marked `failed` — by the instance itself when it comes back
(it owned the answer, so the answer cannot still be running), or by any other instance once
the dead one's lease runs out. It is never left `streaming`, and the user can ask again in the
same conversation. Without Redis the text is the last checkpoint's; with Redis it is everything
the stream log holds, so a tab gets back all it had shown, and the dead turn's stream slot and
reservation are released.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import signal
import sqlite3
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from chat.demo_upstream import long_tokens
from chat.limits.rates import utc_day
from chat.tokens import estimate_tokens
from tests.conftest import assistant_mid
from tests.servers import free_port, migrated_sqlite, running_chatsite, signup
from tests.test_daphne import (
    REDIS_URL,
    Answer,
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    next_json,
    query_one,
    read_answer,
    ready,
    redis_prefix,
    send_prompt,
)

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
            "SELECT status, text, error, conversation_id, admission, prompt_tokens,"
            " completion_tokens, usage_estimated FROM chat_message WHERE mid = ?",
            (mid,),
        ).fetchone()
    found = dict(row)
    found["admission"] = json.loads(found["admission"] or "null")
    return found


def usage_history(db_url: str) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) in every user's Usage history rows."""
    with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=10) as db:
        row = db.execute(
            "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0),"
            " COALESCE(SUM(completion_tokens), 0) FROM chat_usage"
        ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


async def resumed_done(base: str, session: str, mid: str) -> dict[str, Any]:
    """The `done` a tab gets when it resumes the (ended) answer `mid` from the start."""
    async with open_socket(base, session) as socket:
        assert (await json_frame(socket))["type"] == "ready"
        await socket.send(json.dumps({"type": "resume", "mid": mid, "after": -1}))
        while (done := await json_frame(socket))["type"] != "done":
            pass
        return done


async def wait_for_row(db_url: str, mid: str, status: str) -> dict[str, Any]:
    """Wait (at most 15 s) until the message has `status`."""
    async with asyncio.timeout(15):
        while True:
            if (row := message_row(db_url, mid))["status"] == status:
                return row
            await asyncio.sleep(0.1)


def lease_end(db_url: str, mid: str) -> float:
    """When the answer's lease runs out (a Unix time), as its instance last extended it."""
    with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=10) as db:
        query = "SELECT lease_until FROM chat_message WHERE mid = ?"
        (stored,) = db.execute(query, (mid,)).fetchone()
    return datetime.fromisoformat(stored).replace(tzinfo=UTC).timestamp()


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


async def continue_then_kill(base: str, session: str, port: int, db_url: str) -> dict[str, Any]:
    """Ask for a long answer, stop it, Continue it, SIGKILL the server while it goes on.

    Returns the answer's row as its stop left it (with its mid)."""
    async with open_socket(base, session) as socket:
        assert (await json_frame(socket))["type"] == "ready"
        await socket.send(json.dumps({"type": "prompt", "conversation": "", "text": "/long 1000"}))
        while True:
            raw = await asyncio.wait_for(socket.recv(), 10)
            if isinstance(raw, str) and 'class="msg msg-assistant"' in raw:
                mid = assistant_mid(raw)
                break
        assert (await json_frame(socket))["type"] == "chunk"
        await socket.send(json.dumps({"type": "stop", "mid": mid}))
        while (done := await json_frame(socket))["type"] != "done":
            pass
        assert done["status"] == "stopped"
        stopped = {**message_row(db_url, mid), "mid": mid}
        await socket.send(json.dumps({"type": "continue", "mid": mid}))
        received = ""
        while len(received.split()) < 75:  # 1.5 s: past at least two checkpoints
            frame = await json_frame(socket)
            if frame["type"] == "chunk" and frame["mid"] == mid:
                received += frame["text"]
        assert message_row(db_url, mid)["status"] == "streaming"
        os.kill(daphne_pid(port), signal.SIGKILL)
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(socket.recv(), 10)
    return stopped


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
        # The usage it can tell: the prompt its admission recorded, the kept text estimated;
        # counted in the Usage history as a failed turn that showed text is (one request).
        usage = {
            "prompt_tokens": row["admission"]["prompt_tokens"],
            "completion_tokens": estimate_tokens(row["text"]),
        }
        assert usage["prompt_tokens"] > 0 and row["usage_estimated"]
        assert {k: row[k] for k in usage} == usage
        assert (await resumed_done(base, session, mid))["usage"] == usage
        assert usage_history(db_url) == (1, *usage.values())
        conversation = str(uuid.UUID(row["conversation_id"]))  # SQLite keeps 32 hex digits
        async with httpx.AsyncClient(cookies={"sessionid": session}) as http:
            page = (await http.get(f"{base}/c/{conversation}/")).text
        article = re.search(rf'<article[^>]*id="msg-{re.escape(mid)}"[^>]*>', page)
        assert article and 'data-status="failed"' in article.group(0)
        done = await ask_again(base, session, conversation)
        assert done["status"] == "complete"
    client.close()


@pytest.mark.timeout(120)
async def test_a_continuation_cut_by_a_restart_adds_only_what_it_said_to_the_usage(
    tmp_path: Path,
) -> None:
    db_url = migrated_sqlite(tmp_path)
    port = free_port()
    env = {**SLOW, "CHAT_INSTANCE_ID": "restart3"}
    with running_chatsite(database_url=db_url, port=port, **env) as base:
        client = signup(base, "continuer")
        session = client.cookies["sessionid"]
        stopped = await continue_then_kill(base, session, port, db_url)
    assert usage_history(db_url) == (
        1,
        stopped["prompt_tokens"],
        stopped["completion_tokens"],
    )
    with running_chatsite(database_url=db_url, port=port, **env) as base:
        row = await wait_for_row(db_url, stopped["mid"], "failed")
        assert row["text"].startswith(stopped["text"]) and len(row["text"]) > len(stopped["text"])
        assert row["admission"]["base_chars"] == len(stopped["text"])
        # The continuation's own share: the prompt it sent and the text it added (the earlier
        # text was counted when it stopped), added to the answer's and to the Usage history.
        prompt = row["admission"]["prompt_tokens"]
        added = estimate_tokens(row["text"][len(stopped["text"]) :])
        usage = {
            "prompt_tokens": stopped["prompt_tokens"] + prompt,
            "completion_tokens": stopped["completion_tokens"] + added,
        }
        assert {k: row[k] for k in usage} == usage
        assert (await resumed_done(base, session, stopped["mid"]))["usage"] == usage
        assert usage_history(db_url) == (2, *usage.values())
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
    # Another instance (another id) starts once web1's lease has run out: its start-up marks
    # the orphan, not its periodic reaper a lease (15 s) later.
    await asyncio.sleep(max(0.0, lease_end(db_url, mid) - time.time()) + 0.2)
    with running_chatsite(database_url=db_url, CHAT_INSTANCE_ID="web2", **SLOW) as base:
        conversation = str(uuid.UUID(message_row(db_url, mid)["conversation_id"]))
        async with asyncio.timeout(10):
            row = await wait_for_row(db_url, mid, "failed")
        check_interrupted(row, received)
        done = await ask_again(base, session, conversation)
        assert done["status"] == "complete"
    client.close()


# --- with Redis and PostgreSQL: nothing the tab was shown is lost (issue 13, finding 7) --------

CRASH_ENV = {
    "DEMO_TOKENS_PER_SECOND": "200",  # /long 3000 takes 15 s
    "DEMO_TTFB_MS": "0",
    # The checkpoint lags the stream: at the kill the database holds less than the tab saw,
    # while the stream log on Redis holds all of it.
    "CHAT_CHECKPOINT_SECONDS": "2",
    "CHAT_LEASE_SECONDS": "5",
    # One stream at a time: the dead turn's slot must be released for the next prompt.
    "CHAT_MAX_CONCURRENT_STREAMS": "1",
    "CHAT_DAILY_TOKENS": "1000000",
    "REDIS_URL": REDIS_URL,
}


def limiter_state(prefix: str, user_id: int, slot: str) -> tuple[int, bool]:
    """(today's tokens counted for the user, whether the slot is still held) on Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        tokens = client.get(f"{prefix}{{u:{user_id}}}:tokens:{utc_day(time.time())}")
        held = client.zscore(f"{prefix}{{u:{user_id}}}:streams", slot) is not None
    finally:
        client.close()
    return int(tokens or 0), held


async def tokens_once_released(prefix: str, user_id: int, slot: str) -> int:
    """Today's tokens once the slot is no longer held (waits at most 10 s)."""
    async with asyncio.timeout(10):
        while True:
            tokens, held = limiter_state(prefix, user_id, slot)
            if not held:
                return tokens
            await asyncio.sleep(0.05)


async def read_for(ws: ClientConnection, seconds: float) -> Answer:
    """The answer as a tab shows it after `seconds` of streaming."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    seen = await read_answer(ws, until_chunks=1)
    while loop.time() < deadline and seen.done is None:
        seen = await read_answer(ws, seen, until_chunks=len(seen.chunks) + 1)
    return seen


@needs_postgres
@pytest.mark.timeout(180)
async def test_a_tab_cut_off_by_a_crash_gets_back_everything_it_showed_and_can_ask_again() -> None:
    with fresh_postgres_database() as database_url, redis_prefix() as prefix:
        env = {**CRASH_ENV, "CHAT_REDIS_PREFIX": prefix}
        with daphne_instance("crash1", database_url=database_url, **env) as first:
            username = new_username()
            client = await asyncio.to_thread(signup, first.base, username)
            async with chat_socket(first.base, client) as ws:
                await ready(ws)
                await send_prompt(ws, "/long 3000")
                seen = await read_for(ws, 3.0)  # a few seconds into the answer
                assert seen.done is None and seen.mid is not None
                first.kill()  # SIGKILL: no drain, no save, no settle
        row = query_one(
            database_url,
            "SELECT m.text, m.admission, c.user_id, c.id FROM chat_message m"
            " JOIN chat_conversation c ON c.id = m.conversation_id WHERE m.mid = %s",
            seen.mid,
        )
        assert row is not None
        checkpoint, admission, user_id, conversation = row
        assert seen.text.startswith(checkpoint)
        reserved, held = limiter_state(prefix, user_id, admission["slot"])
        assert held and reserved == admission["reserved"]

        # The same instance comes back; the tab reconnects and resumes after its last chunk.
        with daphne_instance("crash1", database_url=database_url, **env) as second:
            async with chat_socket(second.base, client) as ws:
                await ready(ws)
                resume = {"type": "resume", "mid": seen.mid, "after": seen.last_seq}
                await ws.send(json.dumps(resume))
                ended = await read_answer(ws, Answer(mid=seen.mid), timeout=30)
                assert ended.errors == [], ended.errors
                assert ended.done is not None and ended.done["status"] == "failed"
                assert "interrupted" in ended.done["error"]
                # The final HTML ends the answer in the tab with everything it had shown.
                final = next(h for h in ended.html if f'data-mid="{seen.mid}"' in h)
                assert 'data-status="failed"' in final
                source = re.search(r'<template class="source">(.*?)</template>', final, re.S)
                assert source and html.unescape(source.group(1)).startswith(seen.text)
                stored = query_one(
                    database_url, "SELECT status, text FROM chat_message WHERE mid = %s", seen.mid
                )
                assert stored is not None and stored[0] == "failed"
                assert stored[1].startswith(seen.text) and len(stored[1]) > len(checkpoint)
                assert "".join(long_tokens(3000)).startswith(stored[1])
                # The slot is freed (by the reaper, which may still be at it when the tab is
                # told) and the reservation settled for what was delivered.
                tokens = await tokens_once_released(prefix, user_id, admission["slot"])
                assert tokens == admission["prompt_tokens"] + estimate_tokens(stored[1])
                # The tab is told the usage the quota counts, and the Usage history has it.
                usage = {
                    "prompt_tokens": admission["prompt_tokens"],
                    "completion_tokens": estimate_tokens(stored[1]),
                }
                assert ended.done["usage"] == usage
                history = query_one(
                    database_url,
                    "SELECT SUM(requests), SUM(prompt_tokens), SUM(completion_tokens)"
                    " FROM chat_usage WHERE user_id = %s",
                    user_id,
                )
                assert history == (1, *usage.values())
                # A stop of the ended answer is answered with its done, not ignored.
                await ws.send(json.dumps({"type": "stop", "mid": seen.mid}))
                stop_answer = await next_json(ws)
                while stop_answer["type"] == "usage":  # came with the answer resent
                    stop_answer = await next_json(ws)
                assert stop_answer["type"] == "done" and stop_answer["status"] == "failed"
                # The prompt box works: a new prompt is admitted and answered at once.
                await send_prompt(ws, "/echo after the crash", str(conversation))
                again = await read_answer(ws)
                assert again.errors == [], again.errors
                assert again.done is not None and again.done["status"] == "complete"
            client.close()
