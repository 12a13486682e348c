"""The handshake's gates, as ASGI middleware (chatsite/asgi.py puts them in the chain): the
strangers' gate before the session lookup, then the socket caps (per user and per client
address) and the user's rate of new sockets (CHAT_SOCKET_RATE)."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http.cookie import parse_cookie

from chat import metrics, protocol
from chat.limits.limiter import get_limiter
from chat.limits.sockets import Place, SocketCounter, get_socket_counter
from chat.loops import PerLoop

ASGIApp = Callable[..., Awaitable[None]]


class StrangerGateASGIMiddleware:
    """Refuses a handshake that cannot be a user's before Channels looks its session up (a hop
    onto the one ORM thread every turn of every user passes through), and bounds the lookups.

    - No session cookie: refused at once (4401, never accepted: a browser sees a refused
      handshake), nothing counted.
    - An address whose handshakes carried an invalid session too often (forged, expired,
      logged out; CHAT_STRANGER_SOCKET_RATE, counted by SocketCapASGIMiddleware once the
      lookup has said so): refused (4429) before the lookup. An IPv6 address counts by its /64.
    - The lookups themselves wait their turn: at most LOOKUPS_PER_ADDRESS of one address and
      LOOKUPS_IN_FLIGHT of the whole process at once, so a burst cannot run ahead of the count
      and many addresses together cannot queue hundreds of lookups ahead of a turn's start
      (the hostile reviews, docs/security.md). Open sockets never wait here.
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.inner(scope, receive, send)
            return
        if not has_session_cookie(scope):
            metrics.rejected("unauthenticated", "socket")
            await _refuse(receive, send, protocol.CLOSE_UNAUTHENTICATED)
            return
        address = stranger_key(client_address(scope))
        release = await lookup_slots.get().take(address)
        try:
            # Checked once this handshake's turn has come: the lookups before it have counted.
            if await get_limiter().hit_stranger(address, count=False):
                metrics.rejected("rate_limited", "stranger")
                release()
                await _refuse(receive, send, protocol.CLOSE_TOO_MANY_SOCKETS)
                return

            async def first_receive() -> dict[str, Any]:
                release()  # the consumer asks for its first event: the lookup is done
                message: dict[str, Any] = await receive()
                return message

            await self.inner(scope, first_receive, send)
        finally:
            release()


# Session lookups in flight at once (see StrangerGateASGIMiddleware): a few for one address
# (ten tabs reconnecting after a restart wait milliseconds), more for the process.
LOOKUPS_PER_ADDRESS = 4
LOOKUPS_IN_FLIGHT = 16


class LookupSlots:
    """This loop's session lookups in flight, per address and in all (first come, first in)."""

    def __init__(self) -> None:
        self.total = asyncio.Semaphore(LOOKUPS_IN_FLIGHT)
        # address -> (its semaphore, handshakes holding or waiting for it)
        self.per_address: dict[str, list[Any]] = {}

    async def take(self, address: str) -> Callable[[], None]:
        """Wait for a slot of the address, then of the process; returns the release, which
        gives both back once however often it is called."""
        entry = self.per_address.setdefault(address, [asyncio.Semaphore(LOOKUPS_PER_ADDRESS), 0])
        entry[1] += 1
        try:
            await entry[0].acquire()
            try:
                await self.total.acquire()
            except BaseException:
                entry[0].release()
                raise
        except BaseException:
            self._leave(address, entry)
            raise
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self.total.release()
                entry[0].release()
                self._leave(address, entry)

        return release

    def _leave(self, address: str, entry: list[Any]) -> None:
        entry[1] -= 1
        if entry[1] == 0 and self.per_address.get(address) is entry:
            del self.per_address[address]


async def _nothing_to_close(slots: LookupSlots) -> None:
    return None


lookup_slots: PerLoop[LookupSlots] = PerLoop("session lookup slots", LookupSlots, _nothing_to_close)


def stranger_key(address: str) -> str:
    """An address as the strangers' rate counts it: IPv6 by its /64 (one host's, usually)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def has_session_cookie(scope: dict[str, Any]) -> bool:
    """Whether the handshake names a session, read as Channels reads it (the first Cookie
    header only)."""
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            return bool(parse_cookie(value.decode("latin-1")).get(settings.SESSION_COOKIE_NAME))
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
                # A session cookie, but no session behind it: the gate above checks these.
                await get_limiter().hit_stranger(stranger_key(client_address(scope)))
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
