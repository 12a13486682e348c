"""Small pieces of HTTP and SSE for the demo model, as a bare ASGI application speaks them."""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from chat.demo_upstream.answers import MAX_BODY_BYTES, ConnectionCut, DemoRequestError

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]


def unknown_model(name: str) -> DemoRequestError:
    return DemoRequestError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        "model_not_found",
        "model",
    )


def reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(data: str) -> str:
    return "data: " + data + "\n\n"


def json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (sent to us as a JSON escape) cannot be UTF-8; a real server would
        # escape it, so do the same rather than fail.
        return text.encode("utf-8", "backslashreplace")


async def send_json(
    send: Send, status: int, payload: dict[str, Any], headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise DemoRequestError(413, "The request body is too large", "request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_for_disconnect(receive: Receive, client_gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    client_gone.set()


async def sleep_until(loop: asyncio.AbstractEventLoop, due: float) -> None:
    delay = due - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def drop_connection(send: Send) -> None:
    """End a /cut response by closing the socket mid-body, so the client sees a broken stream.

    ASGI has no "abort" message. daphne ignores an exception raised after the body started
    (and would keep the socket open forever), so when `send` is daphne's
    `partial(server.handle_reply, request)` we close its Twisted request directly:
    `loseConnection` flushes what was written and then closes, leaving the chunked body
    unterminated. Any other server gets an exception, which they answer by closing.
    """
    args = getattr(send, "args", ())
    lose = getattr(args[0], "loseConnection", None) if args else None
    if callable(lose):
        lose()
        return
    raise ConnectionCut("the /cut directive ended this response without finishing it")
