"""The upstream client against llama-cpp-python's OpenAI server: the stream's shape, not its words.

Opt-in (`scripts/real_upstream.sh` starts the server and sets REAL_UPSTREAM_URL); a small
model's text is not deterministic enough to compare, so these tests check structure only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import httpx
import pytest

from chat.upstream.client import UpstreamClient
from chat.upstream.errors import UpstreamError
from chat.upstream.items import Delta, Finish, StreamItem, Usage

pytestmark = pytest.mark.real_upstream

BASE_URL = os.environ.get("REAL_UPSTREAM_URL", "")


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    if not BASE_URL:
        pytest.skip("REAL_UPSTREAM_URL is not set: run scripts/real_upstream.sh")
    # A CPU-only model needs patience; the read timeout is the gap between tokens.
    client = UpstreamClient(BASE_URL, read_timeout=120, total_timeout=300)
    yield client
    await client.aclose()


async def model_id() -> str:
    async with httpx.AsyncClient(trust_env=False) as http:
        response = await http.get(BASE_URL + "/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


async def stream(client: UpstreamClient, text: str, max_tokens: int = 24) -> list[StreamItem]:
    messages = [{"role": "user", "content": text}]
    return [
        item
        async for item in client.stream_chat(
            model=await model_id(), messages=messages, max_tokens=max_tokens, temperature=0
        )
    ]


def assert_well_formed(items: list[StreamItem]) -> None:
    """Deltas with text, then exactly one Finish, then exactly one Usage, last."""
    deltas = [item for item in items if isinstance(item, Delta)]
    finishes = [i for i, item in enumerate(items) if isinstance(item, Finish)]
    assert deltas and all(d.text for d in deltas)
    assert len(finishes) == 1 and all(isinstance(item, Delta) for item in items[: finishes[0]])
    assert isinstance(items[-1], Usage) and sum(isinstance(i, Usage) for i in items) == 1
    assert items[-1].completion_tokens > 0 and items[-1].prompt_tokens > 0


async def test_a_stream_has_deltas_a_finish_and_a_usage(client: UpstreamClient) -> None:
    await client.warm()
    items = await stream(client, "Name three colours.")
    assert_well_formed(items)
    finish = next(item for item in items if isinstance(item, Finish))
    assert finish.reason in ("stop", "length")


async def test_max_tokens_ends_the_answer_with_length(client: UpstreamClient) -> None:
    items = await stream(client, "Write a long story about a lighthouse keeper.", max_tokens=8)
    assert_well_formed(items)
    assert Finish("length") in items


async def test_two_streams_at_once_both_finish(client: UpstreamClient) -> None:
    # Started with --interrupt_requests false: a second request must not cut the first.
    first, second = await asyncio.gather(
        stream(client, "Count from one to five."), stream(client, "Say hello.")
    )
    assert_well_formed(first)
    assert_well_formed(second)


async def test_a_cancelled_stream_leaves_the_server_able_to_answer(client: UpstreamClient) -> None:
    got_one = asyncio.Event()

    async def consume() -> None:
        messages = [{"role": "user", "content": "Tell me a long story."}]
        async for item in client.stream_chat(
            model=await model_id(), messages=messages, max_tokens=400
        ):
            if isinstance(item, Delta):
                got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), 120)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_well_formed(await stream(client, "Say yes."))


async def test_a_prompt_over_the_context_window_is_a_clear_error(client: UpstreamClient) -> None:
    # The server runs with a small --n_ctx; this prompt is far over it. llama.cpp answers a
    # 200 with an empty body or an error status, depending on the version: both must become
    # an UpstreamError with a message a user can read.
    with pytest.raises(UpstreamError) as caught:
        await stream(client, "word " * 6000)
    assert caught.value.kind in ("empty", "http_status", "stream_error")
    assert caught.value.message
