"""Flow control for streamed HTTP responses under daphne: a client that stops reading holds
up the view that writes to it, instead of daphne buffering the whole body.

Daphne writes each `http.response.body` message into Twisted's transport and returns at once,
however much is already waiting there for a client that reads nothing. A streamed response (the
account export, docs/security.md) was then handed to daphne in seconds, whole, and its
concurrency slot came back while its bytes sat in memory: one account could start unread
exports one after another and grow an instance by the size of each. Now the `send` of a body
message with more to come waits until the bytes daphne holds for that connection are at most
CHAT_SEND_BUFFER_BYTES (the websockets' bound, chat/sockets/backpressure.py), so the view stays
suspended, and holds its slot, while its client does not read; a client that takes nothing for
HTTP_STALL_SECONDS is aborted (the view then gets its disconnect and ends).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from daphne.server import Server

from chat.sockets.backpressure import limit_bytes, transport_queued_bytes

log = logging.getLogger(__name__)

HTTP_STALL_SECONDS = 60.0  # a client that takes no byte for this long is cut off
POLL_SECONDS = 0.05


async def _drained(server: Any, protocol: Any) -> None:
    """Wait until daphne holds at most the limit for `protocol`'s client (or it is gone)."""
    loop = asyncio.get_running_loop()
    limit = limit_bytes()
    lowest, since = None, loop.time()
    while True:
        state = server.connections.get(protocol)
        if state is None or state.get("disconnected"):
            return  # gone: daphne tells the application with `http.disconnect`
        queued = transport_queued_bytes(getattr(protocol, "transport", None))
        if queued is None or queued <= limit:
            return
        if lowest is None or queued < lowest:
            lowest, since = queued, loop.time()  # the client is reading, however slowly
        elif loop.time() - since > HTTP_STALL_SECONDS:
            log.warning(
                "aborting an HTTP response whose client stopped reading: %d bytes queued "
                "(limit %d, CHAT_SEND_BUFFER_BYTES) for %.0f s",
                queued,
                limit,
                HTTP_STALL_SECONDS,
            )
            protocol.transport.abortConnection()
            return
        await asyncio.sleep(POLL_SECONDS)


def install() -> None:
    """Wrap daphne's Server.handle_reply (the application's `send`); idempotent."""
    original = Server.handle_reply
    if getattr(original, "waits_for_the_reader", False):
        return

    async def handle_reply(self: Any, protocol: Any, message: dict[str, Any]) -> None:
        await original(self, protocol, message)
        if message.get("type") == "http.response.body" and message.get("more_body", False):
            await _drained(self, protocol)

    handle_reply.waits_for_the_reader = True  # type: ignore[attr-defined]
    Server.handle_reply = handle_reply
