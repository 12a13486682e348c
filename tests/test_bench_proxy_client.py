"""The benchmark's client for the peer (bench/clients.py ProxyClient) times every token whole.

LiteLLM itself is not installed for the tests (a ~750 MB install that `make bench-full` does on
first use, never `make test`), so the proxy's side of the wire is played two ways: by the real
demo model, which speaks the same OpenAI-style SSE, and by a small socket server that replays
the stream the way LiteLLM 1.108 re-encodes it (a role-only first delta with `"content":""`,
events split over HTTP chunks and several in one). Nothing here looks at a timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bench.clients import ProxyClient, answer_offsets, long_prompt
from chat.demo_upstream import long_tokens
from tests.demo_server import running_demo_server

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1"


def event(delta: dict[str, str], **extra: object) -> bytes:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "demo-full"}
    chunk["choices"] = [{"index": 0, "delta": delta}]  # type: ignore[assignment]
    return b"data: " + json.dumps({**chunk, **extra}, separators=(",", ":")).encode() + b"\n\n"


def chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> dict[str, object]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    body: dict[str, object] = json.loads(await reader.readexactly(length))
    body["_authorization"] = next(
        (
            line.split(b":", 1)[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"authorization:")
        ),
        "",
    )
    return body


@pytest.fixture
async def litellm_shaped() -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    """A stand-in for LiteLLM's stream: the real proxy is not installed for the tests."""
    requests: list[dict[str, object]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            requests.append(request)
            tokens = long_tokens(int(str(request["messages"][0]["content"]).split()[1]))  # type: ignore[index]
            stream = event({"content": "", "role": "assistant"})
            stream += b"".join(event({"content": t}) for t in tokens)
            stream += event({}, usage={"completion_tokens": len(tokens)}) + b"data: [DONE]\n\n"
            # Pieces of 7, 300 and 64 bytes in turn: events cut in half and events together.
            sizes, pieces, at = [7, 300, 64], [], 0
            while at < len(stream):
                size = sizes[len(pieces) % 3]
                pieces.append(stream[at : at + size])
                at += size
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked(pieces)
            )
            await writer.drain()
        writer.close()

    async with serve(handler) as base:
        yield base, requests


async def test_it_times_every_token_of_the_demo_models_stream() -> None:
    with running_demo_server() as base:
        client = ProxyClient(base, api_key="sk-bench-test")
        await client.open()
        try:
            first = await client.turn(long_prompt(30), 30, timeout=30)
            second = await client.turn(long_prompt(30), 30, timeout=30)  # same connection
        finally:
            await client.close()

    for record in (first, second):
        assert record.ok, record.error
        assert len(record.token_times) == 30
        assert record.token_times == sorted(record.token_times)
        assert record.done is not None and record.frames >= 1


async def test_it_counts_characters_not_events_in_a_re_encoded_stream(
    litellm_shaped: tuple[str, list[dict[str, object]]],
) -> None:
    base, requests = litellm_shaped
    client = ProxyClient(base, api_key="sk-bench-test")
    try:
        record = await client.turn(long_prompt(40), 40, timeout=30, offsets=answer_offsets(40))
    finally:
        await client.close()

    # The empty role delta is not a token, and a token cut over two HTTP chunks counts once.
    assert record.ok, record.error
    assert len(record.token_times) == 40
    assert requests[0]["_authorization"] == "Bearer sk-bench-test"
    assert requests[0]["stream"] is True


async def test_a_short_answer_is_a_failed_turn_not_a_crash() -> None:
    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        stream = event({"content": long_tokens(2)[0]}) + b"data: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked([stream]))
        await writer.drain()
        writer.close()

    async with serve(short) as base:
        record = await ProxyClient(base, api_key="k").turn(long_prompt(2), 2, timeout=30)

    assert not record.ok
    assert "chars, expected" in record.error


async def test_a_refused_request_is_recorded_as_an_error() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = b'{"error":{"message":"Authentication Error"}}'
        writer.write(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    async with serve(refuse) as base:
        client = ProxyClient(base, api_key="wrong")
        record = await client.turn(long_prompt(3), 3, timeout=30)

    assert not record.ok
    assert "401" in record.error
    assert client.reader is None  # the next turn opens a new connection
