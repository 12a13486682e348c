"""The socket's session middleware (chat/middleware.py SocketSessionMiddleware): the session is
resolved as Channels resolves it, and a websocket's frames go out without Channels' per-frame
session checks, which only ever save with an HTTP response."""

from __future__ import annotations

from typing import Any

import pytest
from channels.sessions import CookieMiddleware

from chat.middleware import SocketSessionMiddleware

KEY = "k" * 32


async def run(scope_type: str) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
    seen: dict[str, Any] = {}
    sent: list[dict[str, Any]] = []

    async def outer_send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(scope=scope, send=send)
        await send({"type": f"{scope_type}.send", "text": "a frame"})

    app = CookieMiddleware(SocketSessionMiddleware(inner))
    scope = {"type": scope_type, "headers": [(b"cookie", f"sessionid={KEY}".encode())]}
    await app(scope, None, outer_send)
    return seen["scope"], seen["send"], sent


async def test_a_socket_gets_its_session_and_sends_straight_out() -> None:
    scope, send, sent = await run("websocket")
    assert scope["session"].session_key == KEY  # resolved as Channels does
    assert send.__qualname__ == "run.<locals>.outer_send"  # no wrapper between
    assert sent == [{"type": "websocket.send", "text": "a frame"}]


@pytest.mark.django_db
async def test_http_keeps_channels_wrapper_that_saves_the_session() -> None:
    scope, send, sent = await run("http")
    assert scope["session"].session_key == KEY
    assert getattr(send, "__self__", None).__class__.__name__ == "InstanceSessionWrapper"
    assert sent == [{"type": "http.send", "text": "a frame"}]


def test_the_site_uses_it_for_sockets() -> None:
    from chatsite.asgi import application

    app: Any = application
    layers = []
    while app is not None:
        layers.append(type(app).__name__)
        app = (
            getattr(app, "inner", None)
            or getattr(app, "app", None)
            or (getattr(app, "application_mapping", {}).get("websocket"))
        )
    assert "SocketSessionMiddleware" in layers, layers
    assert "SessionMiddleware" not in layers, layers
