"""The chat sockets open in this process and whether it is draining (shutting down gracefully)."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Protocol

from chat.protocol import CLOSE_RESTARTING

log = logging.getLogger(__name__)

# How long the tabs get to take their queued frames and the close before daphne drops them.
SOCKET_FLUSH_SECONDS = 2.0


class Socket(Protocol):
    """What a drain needs of a chat socket (chat.sockets.consumers.ChatConsumer)."""

    def close_after_sending(self, code: int) -> None: ...


# Consumers add themselves when they accept and call socket_closed() when they disconnect.
# Weak: a consumer that daphne cancels without calling disconnect() must not be kept alive.
sockets: weakref.WeakSet[Socket] = weakref.WeakSet()
_socket_closed: asyncio.Event | None = None  # set while close_sockets() waits
_draining = False


def socket_opened(socket: Socket) -> None:
    sockets.add(socket)


def socket_closed(socket: Socket) -> None:
    """A chat socket finished closing (ChatConsumer.disconnect)."""
    sockets.discard(socket)
    if _socket_closed is not None:
        _socket_closed.set()


def draining() -> bool:
    """Whether this instance is shutting down: readiness fails, no new sockets or turns."""
    return _draining


def start_draining() -> None:
    global _draining
    _draining = True


def reset() -> None:
    """Forget a drain (tests that drain in-process)."""
    global _draining
    _draining = False


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
