"""A hostile upstream cannot wedge a turn or lose an answer (issue 13, finding 11).

A real daphne on PostgreSQL and Redis, its model server a tiny hostile one started here on a
real port: it reports negative and absurd token counts and puts NUL characters in its deltas.
The review saw a negative usage raise in the metrics before the save (no `done`, the answer
lost, the stream slot and the reservation held, the turn leaked) and a NUL that PostgreSQL
refused while the tab was told `complete`. Every answer here must be saved, end with `done`,
free its slot, and what the tab saw must be exactly what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.servers import signup
from tests.test_daphne import (
    REDIS_URL,
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    query_one,
    read_answer,
    ready,
    redis_prefix,
    send_prompt,
)

pytestmark = needs_postgres


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _delta(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def _usage(prompt: int, completion: int) -> bytes:
    return _event(
        {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    )


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\nconnection: close\r\n\r\n"
)

# What the hostile server answers, by the last word of the prompt: deltas, then a usage chunk.
ANSWERS: dict[str, tuple[list[str], tuple[int, int]]] = {
    "negative": (["Counted ", "below ", "zero."], (-5, -1000)),
    "nul": (["Nul\x00 here", "\x00", " and\x00\x00 there."], (7, 5)),
    "nul-and-negative": (["\x00Both\x00 at ", "once."], (-1, -1)),
    # Last: it is charged as far as a count can go, which spends the day's quota.
    "absurd": (["Counted ", "past ", "any column."], (10**30, 10**25)),
}


@contextlib.asynccontextmanager
async def hostile_upstream() -> AsyncIterator[str]:
    """An OpenAI-style server on a free port that streams ANSWERS; yields its base URL."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
            body = await reader.readexactly(int(length.group(1))) if length else b""
            if head.startswith(b"GET"):  # the client warming its pool: GET /models
                models = b'{"object":"list","data":[]}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(models)}\r\nconnection: close\r\n\r\n".encode()
                    + models
                )
            else:
                mode = json.loads(body)["messages"][-1]["content"].split()[-1]
                deltas, (prompt, completion) = ANSWERS[mode]
                writer.write(SSE_HEAD)
                for delta in deltas:
                    writer.write(_delta(delta))
                    await writer.drain()
                writer.write(_usage(prompt, completion) + b"data: [DONE]\n\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


def streams_active(base: str) -> float:
    """The instance's own count of running turns (its /metrics, read from 127.0.0.1)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^chat_streams_active (\S+)$", text, re.MULTILINE)
    assert match, "chat_streams_active is missing from /metrics"
    return float(match.group(1))


@pytest.mark.timeout(120)
async def test_a_hostile_upstream_cannot_lose_an_answer_or_hold_its_slot() -> None:
    async with hostile_upstream() as upstream:
        with (
            fresh_postgres_database() as database_url,
            redis_prefix() as prefix,
            daphne_instance(
                "hostile1",
                database_url=database_url,
                REDIS_URL=REDIS_URL,
                CHAT_REDIS_PREFIX=prefix,
                LLM_BASE_URL=upstream,
                # One stream at a time: an answer that kept its slot would refuse the next.
                CHAT_MAX_CONCURRENT_STREAMS="1",
                CHAT_DAILY_TOKENS="100000",
                CHAT_RATE_LIMIT="100/minute",
            ) as web,
        ):
            client = await asyncio.to_thread(signup, web.base, new_username())
            async with chat_socket(web.base, client) as ws:
                await ready(ws)
                for mode, (deltas, _) in ANSWERS.items():
                    await send_prompt(ws, f"answer {mode}")
                    answer = await read_answer(ws, timeout=20)
                    assert answer.errors == [], (mode, answer.errors)
                    assert answer.done is not None, f"{mode}: no done"
                    assert answer.done["status"] == "complete", (mode, answer.done)
                    expected = "".join(deltas).replace("\x00", "")
                    # What the tab saw is exactly what is stored, without the NULs.
                    assert answer.text == expected, mode
                    row = query_one(
                        database_url,
                        "SELECT status, text, prompt_tokens, completion_tokens, html"
                        " FROM chat_message WHERE mid = %s",
                        answer.mid,
                    )
                    assert row is not None
                    status, text, prompt_tokens, completion_tokens, html = row
                    assert (status, text) == ("complete", expected), mode
                    assert 0 <= prompt_tokens < 2**31 and 0 <= completion_tokens < 2**31, row
                    assert html and "\x00" not in html, mode
                    # The final HTML frame reached the tab too.
                    assert any(f'data-mid="{answer.mid}"' in h for h in answer.html), mode
                    assert answer.done["usage"]["prompt_tokens"] >= 0, mode
                    assert answer.done["usage"]["completion_tokens"] >= 0, mode
            usage = query_one(
                database_url,
                "SELECT count(*), min(prompt_tokens), min(completion_tokens) FROM chat_usage",
            )
            assert usage is not None and usage[0] >= 1 and usage[1] >= 0 and usage[2] >= 0
            # Every turn left the registry: none is counted as running any more.
            assert streams_active(web.base) == 0
            client.close()
