"""The socket fuzz of tests/test_security_fuzz.py against a real daphne on a fresh PostgreSQL
database: PostgreSQL refuses what SQLite stores (NUL in text), so a frame that passes on SQLite
can still close the socket with 1011 here. Same frames, same expectations, over a real socket;
the count of stored messages is read from PostgreSQL itself."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import assume, example, given
from websockets.asyncio.client import ClientConnection

from tests.servers import signup
from tests.test_daphne import (
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    query_one,
    read_answer,
    ready,
    send_prompt,
)
from tests.test_security_fuzz import _nest, expected_outcome, frames, settings_for_fuzz

pytestmark = [needs_postgres, pytest.mark.timeout(900)]


def stored_messages(database_url: str) -> int:
    row = query_one(database_url, "SELECT count(*) FROM chat_message")
    assert row is not None
    return int(row[0])


async def outcome_of(ws: ClientConnection) -> tuple[str, dict[str, Any]]:
    """Read until an `error` or a `done` arrives (HTML and chunks in between are skipped)."""
    while True:
        raw = await asyncio.wait_for(ws.recv(), 20)
        if isinstance(raw, bytes) or not raw.startswith("{"):
            continue
        frame = json.loads(raw)
        if frame["type"] == "error":
            return "error", frame
        if frame["type"] == "done":
            return "answer", frame


async def check_one_frame(
    ws: ClientConnection, database_url: str, kind: str, raw: str | bytes, seen: dict[str, int]
) -> None:
    before = await asyncio.to_thread(stored_messages, database_url)
    await ws.send(raw)  # a str goes as a text frame, bytes as a binary frame
    outcome, frame = await outcome_of(ws)
    seen[outcome] = seen.get(outcome, 0) + 1
    after = await asyncio.to_thread(stored_messages, database_url)
    assert outcome == expected_outcome(kind, raw), (raw[:200], frame)
    if outcome == "error":
        assert frame["code"] in {"bad_request", "not_found"}, frame
        assert frame["message"]
        assert after == before, "an invalid frame stored something"
    else:
        assert after == before + 2  # the prompt and its answer, nothing else


def sendable(kind: str, raw: str | bytes) -> bool:
    """A browser can only send text that is valid UTF-8 (no lone surrogates)."""
    if kind == "bytes" or isinstance(raw, bytes):
        return True
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def test_hostile_frames_never_crash_a_real_daphne_on_postgresql() -> None:
    with (
        fresh_postgres_database("chatsite_fuzz_ws") as database_url,
        daphne_instance(
            "web1",
            database_url=database_url,
            CHAT_RATE_LIMIT="100000/minute",
            CHAT_MAX_CONCURRENT_STREAMS="20",
            # A random prompt that happens to be a directive must not stall the run.
            LLM_READ_TIMEOUT="2",
            LLM_TOTAL_TIMEOUT="5",
        ) as server,
    ):
        client = await asyncio.to_thread(signup, server.base, new_username())
        loop = asyncio.get_running_loop()
        seen: dict[str, int] = {}
        # No cap on what the server sends, as in a browser: a random directive (`/long …`,
        # `/markdown …`) may make an answer's final frame larger than websockets' default 1 MiB.
        async with chat_socket(server.base, client, max_size=None) as ws:
            await ready(ws)

            # hypothesis drives the examples from a worker thread; each frame is sent and read
            # on this loop, where the socket lives.
            @settings_for_fuzz
            @given(frame=frames)
            @example(frame=("text", '{"type": "prompt", "conversation": "", "text": "a\\u0000b"}'))
            @example(frame=("text", '{"type": "prompt", "conversation": "", "text": "a\x00b"}'))
            @example(frame=("text", '{"type": "stop", "mid": "1-web1-\\u0000"}'))
            @example(frame=("text", '{"type": "resume", "mid": "\x00", "after": 1}'))
            @example(frame=("text", '{"type": "prompt", "conversation": "\\u0000", "text": "x"}'))
            @example(frame=("text", '{"type": "prompt", "text": ' + _nest(50_000, "list") + "}"))
            @example(frame=("text", "\x00\ufffe\U0010ffff"))
            @example(frame=("bytes", b"\xff\x00"))
            def run(frame: tuple[str, str | bytes]) -> None:
                assume(sendable(*frame))
                asyncio.run_coroutine_threadsafe(
                    check_one_frame(ws, database_url, *frame, seen), loop
                ).result(timeout=60)

            await asyncio.to_thread(run)
            assert seen.get("answer", 0) >= 10 and seen.get("error", 0) >= 50, seen
            # Still the same socket, still answering.
            await send_prompt(ws, "/echo ok")
            answer = await read_answer(ws)
        assert answer.text == "ok"
        assert answer.done is not None and answer.done["status"] == "complete"
        assert "Traceback" not in server.log(), server.log()[-5000:]
