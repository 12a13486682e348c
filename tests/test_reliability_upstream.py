"""Upstream failures through the socket: each ends the turn cleanly and costs only what it gave.

HTTP errors, a stall, a drop mid-answer, garbage in the stream and a slow trickle each end
with `done` status `failed` and a clear message, the partial answer saved as failed, the quota
charged only for what was delivered (the rest of the reservation refunded), and the socket
usable afterwards. The demo model plays the well-known failures; a tiny misbehaving HTTP
server, started here on a real port, plays the ones no polite server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.limits.limiter import get_limiter
from chat.models import Message
from chat.turns.registry import registry
from tests.conftest import receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")


@pytest.fixture(autouse=True, params=["aiohttp", "httpx"])
def http_backend(request: pytest.FixtureRequest, settings: Any) -> str:
    """Every failure here is met on both readers of the model's stream (LLM_HTTP_BACKEND)."""
    settings.LLM_HTTP_BACKEND = request.param
    return str(request.param)


READ_TIMEOUT = 0.5
TOTAL_TIMEOUT = 1.5


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _delta(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\nconnection: close\r\n\r\n"
)
Writer = asyncio.StreamWriter
Behaviour = Callable[[Writer], Awaitable[None]]


async def _garbage(writer: Writer) -> None:
    writer.write(SSE_HEAD + _delta("Hello ") + b"data: {this is not json\n\n")


async def _noise_then_drop(writer: Writer) -> None:
    # Invalid UTF-8, NULs, unknown fields and comments are ignored by the SSE rules; then the
    # server hangs up without [DONE].
    writer.write(SSE_HEAD + _delta("Hello "))
    writer.write(b"\xff\xfe\x00garbage\r\nrandom: field\n: a comment\nevent\n\n" + _delta("there"))


async def _error_event(writer: Writer) -> None:
    writer.write(SSE_HEAD + _delta("Hello ") + _event({"error": {"message": "overloaded now"}}))


async def _empty(writer: Writer) -> None:
    # llama.cpp's answer to a prompt over its context window: 200 and nothing.
    writer.write(SSE_HEAD)


async def _html_502(writer: Writer) -> None:
    body = b"<html><body><h1>502 Bad Gateway</h1><script>x()</script></body></html>"
    writer.write(
        b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/html\r\n"
        + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


async def _trickle(writer: Writer) -> None:
    # One byte every 100 ms: never silent long enough for the read timeout, so only the
    # total timeout can end it.
    writer.write(SSE_HEAD + _delta("Hello "))
    await writer.drain()
    for byte in _delta("never finished " * 20):
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(0.1)


BEHAVIOURS: dict[str, Behaviour] = {
    "garbage": _garbage,
    "noise": _noise_then_drop,
    "error_event": _error_event,
    "empty": _empty,
    "html_502": _html_502,
    "trickle": _trickle,
}


@dataclass
class HostileUpstream:
    """A real HTTP server on a free port: its answer is chosen by the last user message."""

    url: str = ""
    open_connections: int = 0
    completions: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        self.open_connections += 1
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
                self.completions += 1
                mode = json.loads(body)["messages"][-1]["content"].split()[-1]
                await BEHAVIOURS[mode](writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up on us: exactly what a timeout should do
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.open_connections -= 1


@pytest.fixture
async def hostile_upstream() -> AsyncIterator[HostileUpstream]:
    upstream = HostileUpstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream.url = f"http://127.0.0.1:{port}/v1"
    async with server:
        yield upstream
        server.close()


@pytest.fixture
def quota(settings: Any) -> int:
    """A daily token quota, so reservations and refunds are counted."""
    settings.CHAT_DAILY_TOKENS = 100_000
    settings.CHAT_RESERVE_TOKENS = 1000
    settings.LLM_READ_TIMEOUT = READ_TIMEOUT
    settings.LLM_TOTAL_TIMEOUT = TOTAL_TIMEOUT
    return 100_000


async def tokens_today(user: Any) -> int:
    used, _ = await get_limiter().tokens_today(user.pk)
    return used


async def eventually(condition: Callable[[], bool], timeout: float = 10) -> None:
    """Wait until `condition()` holds, at most `timeout` seconds (polling: nothing signals)."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - state of another task, with no event to await
            await asyncio.sleep(0.02)


async def turn_ended(mid: str) -> None:
    """The turn has settled its quota and left the registry."""
    await eventually(lambda: registry.get(mid) is None)


async def ask(comm: Any, text: str) -> dict[str, Any]:
    await comm.send_to(text_data=json.dumps({"type": "prompt", "conversation": "", "text": text}))
    return await receive_until_done(comm, timeout=15)


async def check_failed_turn(
    comm: Any, owner: Any, text: str, expected_error: str, *, partial: bool
) -> dict[str, Any]:
    before = await tokens_today(owner)
    result = await ask(comm, text)
    done = result["done"]
    assert done["status"] == "failed"
    assert re.search(expected_error, done["error"]), done["error"]
    assert "<" not in done["error"], "markup from the upstream reached the message"
    for upstream_words in ("failed on purpose", "overloaded now", "Bad Gateway", "not JSON"):
        assert upstream_words not in done["error"], "the model server's words reached the user"
    # The bubble says what happened and offers a retry.
    assert 'data-status="failed"' in result["html"][-1] and "Retry" in result["html"][-1]
    message = await database_sync_to_async(Message.objects.get)(mid=done["mid"])
    assert message.status == "failed"
    assert message.error == done["error"]
    assert message.text == result["text"], "the partial answer was not saved as streamed"
    assert bool(message.text) == partial
    await turn_ended(done["mid"])
    charged = await tokens_today(owner) - before
    if partial:
        # What was delivered is charged; the rest of the 1000-token reservation came back.
        usage = done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]
        assert charged == usage and 0 < usage < 1000
    else:
        assert charged == 0, "a failed answer that delivered nothing must cost nothing"
    return result


async def check_socket_still_works(comm: Any, settings: Any, demo_upstream: str) -> None:
    settings.LLM_BASE_URL = demo_upstream
    result = await ask(comm, "/echo still here")
    assert (result["text"], result["done"]["status"]) == ("still here", "complete")


@pytest.mark.parametrize(
    ("text", "expected_error", "partial"),
    [
        ("/fail 500", r"^The model server had a problem and could not answer$", False),
        ("/fail 429", r"^The model server is busy right now$", False),
        ("/fail 401", r"refused this site's request", False),
        ("/stall 5", rf"took longer than {READ_TIMEOUT:g} s", False),
        ("/cut 7", r"connection dropped before the answer finished", True),
    ],
)
async def test_the_demo_models_failures_end_the_turn_cleanly(
    connect: Any,
    owner: Any,
    settings: Any,
    demo_upstream: str,
    quota: int,
    text: str,
    expected_error: str,
    partial: bool,
) -> None:
    comm = await connect(owner)
    await check_failed_turn(comm, owner, text, expected_error, partial=partial)
    await check_socket_still_works(comm, settings, demo_upstream)


@pytest.mark.parametrize(
    ("mode", "expected_error", "partial"),
    [
        ("garbage", r"sent something that is not an answer", True),
        ("noise", r"connection dropped before the answer finished", True),
        ("error_event", r"^The model server reported an error while answering$", True),
        ("empty", r"empty answer", False),
        ("html_502", r"^The model server had a problem and could not answer$", False),
        ("trickle", rf"took longer than {TOTAL_TIMEOUT:g} s", True),
    ],
)
async def test_a_misbehaving_upstream_ends_the_turn_cleanly(
    connect: Any,
    owner: Any,
    settings: Any,
    demo_upstream: str,
    quota: int,
    hostile_upstream: HostileUpstream,
    mode: str,
    expected_error: str,
    partial: bool,
) -> None:
    settings.LLM_BASE_URL = hostile_upstream.url
    comm = await connect(owner)
    result = await check_failed_turn(comm, owner, f"/echo {mode}", expected_error, partial=partial)
    if partial:
        assert result["text"].startswith("Hello ")
    assert hostile_upstream.completions == 1
    # We hung up (or read to the end): no connection to the upstream is left open.
    await eventually(lambda: not hostile_upstream.open_connections, timeout=5)
    await check_socket_still_works(comm, settings, demo_upstream)
