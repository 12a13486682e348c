"""Graceful shutdown: on SIGTERM stop taking sockets, let turns finish, close tabs to move them.

daphne runs on Twisted's asyncio reactor and has no ASGI lifespan events. Twisted turns SIGTERM
and SIGINT into `reactor.stop()`, which fires the "before shutdown" triggers and waits for the
Deferreds they return. `GracefulShutdown` (the outermost ASGI layer) installs ours on its first
call. In order, it:

1. marks the instance draining: `/readyz` answers 503, new sockets are closed with 4503
   (restarting: come back) as soon as they open, frames that would start a turn get an `error`
   frame (`unavailable`) instead;
2. stops listening, so nginx sends new connections to the other instances;
3. lets running turns end within `CHAT_SHUTDOWN_GRACE` seconds, then cancels the rest — a
   cancelled turn saves its partial answer as `failed` ("interrupted") through its own cancel
   path, so tabs show it and can retry;
4. closes every socket with 4503 once its queued frames are sent: the tabs reconnect through
   nginx to another instance and resume there;
5. only then runs daphne's own trigger, which cancels what is left of the application.

daphne registers step 5's trigger before ours; left alone, Twisted would call it at the same
time as ours and kill the sockets and the model streams (the built-in demo model is an HTTP
application of this very process) at the start of the grace period. So we take it out of
Twisted's list and call it ourselves at the end. While hooked in, we also make autobahn close a
frame over daphne's 1 MiB limit with code 1009 instead of dropping the TCP connection, and
bound what daphne buffers for a tab that stops reading (chat/backpressure.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from typing import Any, Protocol

from django.conf import settings

from chat import backpressure

log = logging.getLogger(__name__)

# Like the app's other 4xxx codes (4401, 4408): 4000 + an HTTP status, here 503. The standard
# 1012 (service restart) is refused by autobahn, which lets applications send 1000 or 3000-4999.
CLOSE_RESTARTING = 4503
# How long the tabs get to take their queued frames and the close before daphne drops them.
SOCKET_FLUSH_SECONDS = 2.0
DEFAULT_GRACE_SECONDS = 20.0
UNAVAILABLE = "This server is restarting; your message was not sent. Send it again in a moment."

ASGIApp = Any


class Socket(Protocol):
    """What shutdown needs of a chat socket (chat.consumers.ChatConsumer)."""

    def close_after_sending(self, code: int) -> None: ...


# The chat sockets open in this process: consumers add themselves when they accept and call
# socket_closed() when they disconnect. Weak: a consumer that daphne cancels without calling
# disconnect() must not be kept alive by us.
sockets: weakref.WeakSet[Socket] = weakref.WeakSet()
_socket_closed: asyncio.Event | None = None  # set while close_sockets() waits


def socket_closed(socket: Socket) -> None:
    """A chat socket finished closing (ChatConsumer.disconnect)."""
    sockets.discard(socket)
    if _socket_closed is not None:
        _socket_closed.set()


_draining = False
_installed = False


def draining() -> bool:
    """Whether this instance is shutting down (readiness fails, no new sockets or turns)."""
    return _draining


def grace_seconds() -> float:
    return float(getattr(settings, "CHAT_SHUTDOWN_GRACE", DEFAULT_GRACE_SECONDS))


async def drain(grace: float, *, stop_listening: bool = True) -> None:
    """Steps 1 to 4 above (step 5 belongs to daphne); also usable without Twisted (tests)."""
    global _draining
    from chat.turns import registry

    _draining = True
    running = len(registry.turns)
    log.warning(
        "shutting down: %d turns running, %d sockets open; grace %.0f s",
        running,
        len(sockets),
        grace,
    )
    if stop_listening:
        _stop_listening()
    await registry.drain(grace)
    if running:
        log.warning("shutdown: turns ended (%d still registered)", len(registry.turns))
    await close_sockets()
    from chat.startup import close_services

    await close_services(timeout=5.0)  # the stream log writes what it has queued


async def close_sockets(timeout: float = SOCKET_FLUSH_SECONDS) -> None:
    """Close every chat socket with 4503 after the frames it has queued; wait until closed.

    Waiting for the tabs' side of the closing handshake matters: when this returns daphne
    drops every connection, and a close frame still in a send buffer would be lost.
    """
    global _socket_closed
    closing = list(sockets)
    for socket in closing:
        socket.close_after_sending(CLOSE_RESTARTING)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    _socket_closed = event = asyncio.Event()
    try:
        # A socket leaves `sockets` in disconnect(), once the closing handshake is done.
        while any(socket in sockets for socket in closing):
            event.clear()
            await asyncio.wait_for(event.wait(), deadline - loop.time())
    except TimeoutError:
        log.warning("shutdown: %d sockets did not close in time", len(sockets))
    finally:
        _socket_closed = None


def _stop_listening() -> None:
    if "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import reactor, tcp

    readers: list[Any] = reactor.getReaders()  # type: ignore[misc]
    for reader in readers:
        if isinstance(reader, tcp.Port):  # also unix.Port, a subclass
            reader.stopListening()


# --- hooking into daphne ------------------------------------------------------------------------


def install() -> bool:
    """Install the shutdown trigger on daphne's reactor, once; False when not under daphne."""
    global _installed
    if _installed:
        return True
    reactor = _running_reactor()
    if reactor is None:
        return False
    from twisted.internet.defer import Deferred

    daphne_kill = _take_daphne_trigger(reactor)
    _close_oversized_frames_cleanly()
    backpressure.install()  # a tab that stops reading is cut off (daphne #170)

    def before_shutdown() -> Deferred[Any]:
        drained = Deferred.fromFuture(asyncio.ensure_future(_drain_safely()))
        if daphne_kill is not None:
            drained.addBoth(lambda _: daphne_kill())
        return drained

    reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
    _installed = True
    return True


async def _drain_safely() -> None:
    try:
        await drain(grace_seconds())
    except Exception:
        log.exception("graceful shutdown failed; stopping anyway")


def _running_reactor() -> Any | None:
    """daphne's reactor, when this code runs on its event loop; never installs one itself."""
    if "twisted.internet.reactor" not in sys.modules:
        return None  # importing it would install a reactor: we are not under daphne
    from twisted.internet import asyncioreactor, reactor

    if not isinstance(reactor, asyncioreactor.AsyncioSelectorReactor) or not reactor.running:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return reactor if reactor._asyncioEventloop is loop else None


def _take_daphne_trigger(reactor: Any) -> Any | None:
    """Remove daphne's kill_all_applications from the before-shutdown triggers; return it."""
    try:
        event = reactor._eventTriggers["shutdown"]
        for callable_, args, kwargs in list(event.before):
            if getattr(callable_, "__name__", "") == "kill_all_applications":
                reactor.removeSystemEventTrigger(("shutdown", ("before", callable_, args, kwargs)))
                return callable_
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    log.warning(
        "shutdown: daphne's shutdown trigger was not found; sockets may close before the "
        "grace period ends"
    )
    return None


def _close_oversized_frames_cleanly() -> None:
    """Make a frame over daphne's size limit (1 MiB) end in close code 1009, not a TCP drop.

    autobahn fails a connection by dropping TCP (its `failByDrop` option, on by default), so
    the tab sees 1006 and cannot tell "too big" from a network error. Only for this one
    failure we turn the option off on that connection: autobahn then sends a close frame with
    1009. Turning it off for every connection instead made the churn test
    (tests/test_reliability_load.py) fail in 3 runs of 4: keep the change to this one case.
    """
    from daphne.ws_protocol import WebSocketProtocol

    original = WebSocketProtocol._fail_connection
    if getattr(original, "closes_too_big_cleanly", False):
        return
    too_big = WebSocketProtocol.CLOSE_STATUS_CODE_MESSAGE_TOO_BIG

    def _fail_connection(self: Any, code: int = 1001, reason: str = "going away") -> None:
        if code == too_big:
            self.failByDrop = False
        original(self, code, reason)

    _fail_connection.closes_too_big_cleanly = True  # type: ignore[attr-defined]
    WebSocketProtocol._fail_connection = _fail_connection


# --- the ASGI layer ---------------------------------------------------------------------------


class GracefulShutdown:
    """Outermost ASGI layer: installs the trigger; refuses new sockets and turns while draining."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not _installed:
            install()
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        if _draining:
            await receive()  # websocket.connect
            # Accept-then-close rather than refuse: a refused handshake is an HTTP 403 the
            # tab cannot tell from "forbidden"; 4503 says "come back", and nginx's next try
            # lands on another instance.
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": CLOSE_RESTARTING})
            return

        async def receive_unless_draining() -> dict[str, Any]:
            while True:
                message: dict[str, Any] = await receive()
                if _draining and message["type"] == "websocket.receive":
                    from chat import frames
                    from chat.middleware import turn_estimate

                    if turn_estimate(message.get("text")) is not None:
                        await send(
                            {
                                "type": "websocket.send",
                                "text": frames.error("unavailable", UNAVAILABLE, retry_after=1),
                            }
                        )
                        continue
                return message

        await self.app(scope, receive_unless_draining, send)


def reset() -> None:
    """Forget a drain (tests that drain in-process)."""
    global _draining
    _draining = False
