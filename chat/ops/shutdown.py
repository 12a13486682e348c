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
bound what daphne buffers for a tab that stops reading (chat/sockets/backpressure.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
from typing import Any

from daphne.ws_protocol import WebSocketProtocol
from django.conf import settings
from twisted.internet import asyncioreactor, tcp
from twisted.internet.defer import Deferred

from chat.ops import http_flow
from chat.ops.startup import close_services
from chat.sockets import backpressure, draining, quiet_logs
from chat.turns.mirror import mirrors
from chat.turns.registry import registry

log = logging.getLogger(__name__)

ASGIApp = Any

_installed = False


async def drain(grace: float, *, stop_listening: bool = True) -> None:
    """Steps 1 to 4 above (step 5 belongs to daphne); also usable without Twisted (tests)."""
    draining.start_draining()
    running = len(registry.turns)
    log.warning(
        "shutting down: %d turns running, %d sockets open; grace %.0f s",
        running,
        len(draining.sockets),
        grace,
    )
    if stop_listening:
        _stop_listening()
    await registry.drain(grace)
    if running:
        log.warning("shutdown: turns ended (%d still registered)", len(registry.turns))
    await draining.close_sockets()
    await mirrors.stop_all()  # followers of answers elsewhere: their tabs resume there
    await close_services(timeout=5.0)  # the stream log writes what it has queued


def _reactor() -> Any | None:
    """Twisted's reactor if one was installed (by daphne), without importing it: importing
    `twisted.internet.reactor` installs one."""
    return sys.modules.get("twisted.internet.reactor")


def _stop_listening() -> None:
    reactor = _reactor()
    if reactor is None:
        return
    readers: list[Any] = reactor.getReaders()
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
    daphne_kill = _take_daphne_trigger(reactor)
    _close_oversized_frames_cleanly()
    backpressure.install()  # a tab that stops reading is cut off (daphne #170)
    quiet_logs.install()  # autobahn's debug lines cost nothing unless written
    http_flow.install()  # a streamed response waits for its reader

    def before_shutdown() -> Deferred[Any]:
        drained = Deferred.fromFuture(start_drain())
        if daphne_kill is not None:
            drained.addBoth(lambda _: daphne_kill())
        return drained

    reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
    _installed = True
    return True


def start_drain() -> asyncio.Task[None]:
    """The drain as a task of its own, in a context of its own. Twisted's SIGTERM handler
    schedules the stop with call_soon_threadsafe, which copies the context of whatever the
    signal interrupted — often a turn — and the drain, its log lines ("shutting down: …") and
    what it starts would carry that turn's ids (`turn`, `mid`, `user`)."""
    return asyncio.get_event_loop().create_task(_drain_safely(), context=contextvars.Context())


async def _drain_safely() -> None:
    try:
        await drain(settings.CHAT_SHUTDOWN_GRACE)
    except Exception:
        log.exception("graceful shutdown failed; stopping anyway")


def _running_reactor() -> Any | None:
    """daphne's reactor, when this code runs on its event loop; never installs one itself."""
    reactor = _reactor()
    if reactor is None:
        return None  # we are not under daphne
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
    """Outermost ASGI layer: installs the shutdown trigger on daphne's reactor on first use.

    daphne has no lifespan events; the first connection is the earliest moment we run on its
    loop. Refusing new sockets and turns while draining is the consumer's and the frame
    middleware's job (they read `chat.sockets.draining.draining()`).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not _installed:
            install()
        await self.app(scope, receive, send)
