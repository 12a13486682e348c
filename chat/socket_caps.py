"""The handshake's gates, as ASGI middleware (chatsite/asgi.py puts them in the chain): the
strangers' gate before the session lookup, then the socket caps (per user and per client
address) and the user's rate of new sockets (CHAT_SOCKET_RATE)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http.cookie import parse_cookie

from chat import metrics, protocol
from chat.limits.limiter import get_limiter
from chat.limits.sockets import Place, SocketCounter, get_socket_counter

ASGIApp = Callable[..., Awaitable[None]]


class StrangerGateASGIMiddleware:
    """Refuses a handshake that cannot be a user's before Channels looks its session up (a hop
    onto the one ORM thread every turn of every user passes through): one without a session
    cookie, at once, and any from an address whose handshakes carried an invalid session too
    often (CHAT_STRANGER_SOCKET_RATE, counted by SocketCapASGIMiddleware below). Anonymous
    handshakes in a loop slowed every other user's first token (docs/security.md).

    Closed as the consumer closes a stranger (4401, never accepted: a browser sees a refused
    handshake); over the rate 4429.
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            if not has_session_cookie(scope):
                metrics.rejected("unauthenticated", "socket")
                await _refuse(receive, send, protocol.CLOSE_UNAUTHENTICATED)
                return
            if await get_limiter().hit_stranger(client_address(scope), count=False):
                metrics.rejected("rate_limited", "stranger")
                await _refuse(receive, send, protocol.CLOSE_TOO_MANY_SOCKETS)
                return
        await self.inner(scope, receive, send)


def has_session_cookie(scope: dict[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"cookie" and parse_cookie(value.decode("latin-1")).get(
            settings.SESSION_COOKIE_NAME
        ):
            return True
    return False


async def _refuse(receive: Any, send: Any, code: int) -> None:
    """Refuse the handshake (not accepted: daphne answers 403) once it arrives."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": code})


class SocketCapASGIMiddleware:
    """Caps open sockets per user and per client address at the handshake (issue 13.6), and
    how often one user may open one (CHAT_SOCKET_RATE: the resume storm, docs/security.md).

    The decision rides on the `websocket.connect` event (`protocol.VERDICT_KEY`: a Refusal
    when over a cap); the consumer then says why and closes with 4429, since a refused
    handshake is an HTTP 403 a page cannot tell from "forbidden". The socket's places are
    given back when the socket's application ends, however it ends.
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        user = scope.get("user")
        if scope["type"] != "websocket" or user is None or not user.is_authenticated:
            if scope["type"] == "websocket":
                # A session cookie, but no session behind it: the gate above counts these.
                await get_limiter().hit_stranger(client_address(scope))
            await self.inner(scope, receive, send)  # the consumer refuses a stranger itself
            return
        counter = get_socket_counter()
        held: list[Place] = []

        async def capped_receive() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "websocket.connect":
                # The caps first: a tab refused for a cap (it retries every few seconds) does
                # not use up the user's rate of handshakes, which its open tabs need to
                # reconnect; a tab over the rate gives its place back at once.
                taken = await counter.take(user.pk, client_address(scope))
                if not isinstance(taken, Place):
                    metrics.rejected("too_many_sockets", "socket")
                    return {**message, protocol.VERDICT_KEY: _too_many_sockets(counter, taken)}
                over = await get_limiter().hit_socket(user.pk)
                if over is not None:
                    counter.release(taken)
                    metrics.rejected(over.code, "socket")
                    refusal = protocol.Refusal(
                        over.code,
                        over.message,
                        retry_after=over.retry_after,
                        reset_at=over.reset_at,
                    )
                    return {**message, protocol.VERDICT_KEY: refusal}
                held.append(taken)
            return message

        try:
            await self.inner(scope, capped_receive, send)
        finally:
            for place in held:
                counter.release(place)


def client_address(scope: dict[str, Any]) -> str:
    """The client's address: daphne's peer, which behind nginx is the client only when daphne
    runs with --proxy-headers and nginx overwrites X-Forwarded-For (deploy/nginx.conf does)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _too_many_sockets(counter: SocketCounter, which: str) -> protocol.Refusal:
    if which == "user":
        message = (
            f"Your account has {counter.per_user} chat tabs open, the most allowed. Close one "
            "of them and this tab reconnects by itself."
        )
    else:
        message = (
            f"Your network address has {counter.per_address} chat connections open, the most "
            "allowed. Close some tabs and this one reconnects by itself."
        )
    return protocol.Refusal("too_many_sockets", message, retry_after=SOCKETS_RETRY_AFTER)


# A tab over the cap tries again after this (a pause, not a promise: nobody knows when
# another tab closes).
SOCKETS_RETRY_AFTER = 10
