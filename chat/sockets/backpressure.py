"""Bound the bytes daphne holds for a websocket whose client stopped reading (daphne #170).

Before daphne writes a frame, the bytes already waiting in user space for that connection
(autobahn's queue plus Twisted's transport buffer) are compared with CHAT_SEND_BUFFER_BYTES;
past it the frame and every later one are dropped, a 4408 close is queued and the connection
is aborted, counted and logged once. It also lifts autobahn's incoming size limit from our own
outgoing frames. Why, and what was measured: docs/decisions/backpressure.md.
"""

from __future__ import annotations

import logging
from typing import Any

from daphne.ws_protocol import WebSocketProtocol
from django.conf import settings

from chat import metrics
from chat.protocol import CLOSE_TOO_SLOW

log = logging.getLogger(__name__)


def transport_queued_bytes(transport: Any) -> int | None:
    """Bytes a Twisted transport holds that the kernel has not taken yet; None if unknown.

    For a TCP connection (twisted.internet.abstract.FileDescriptor): the part of
    `dataBuffer` not yet written (from `offset`) plus the list `_tempDataBuffer`, whose
    length is `_tempDataLen`. A wrapping transport (TLS: a ProtocolWrapper) is followed down
    to the connection it writes to: the encrypted bytes wait there.
    """
    for _ in range(4):  # TLS over TCP is two levels; never loop on a strange object
        if transport is None:
            return None
        try:
            data_buffer = transport.dataBuffer
            offset = transport.offset
            temp_len = transport._tempDataLen
        except AttributeError:
            transport = getattr(transport, "transport", None)
            continue
        if isinstance(data_buffer, bytes | bytearray | memoryview) and isinstance(offset, int):
            return len(data_buffer) - offset + int(temp_len)
        return None
    return None


def queued_bytes(protocol: Any) -> int | None:
    """Bytes waiting in user space for one of daphne's websocket protocols (see above)."""
    queued = transport_queued_bytes(getattr(protocol, "transport", None))
    if queued is None:
        return None
    # autobahn queues frames itself only when asked to chop or sync writes (daphne does
    # neither); count them anyway so nothing slips past.
    send_queue = getattr(protocol, "send_queue", None) or ()
    return queued + sum(len(data) for data, _sync in send_queue)


def limit_bytes() -> int:
    return int(settings.CHAT_SEND_BUFFER_BYTES)


def _cut(protocol: Any, queued: int, limit: int) -> None:
    """Abort a slow reader's connection: once per socket, logged and counted."""
    protocol.chat_cut_as_slow_reader = True
    metrics.slow_reader_closed()
    client = getattr(protocol, "client_addr", None)
    log.warning(
        "aborting a websocket that stopped reading: %d bytes queued for it (limit %d, "
        "CHAT_SEND_BUFFER_BYTES); client %s",
        queued,
        limit,
        f"{client[0]}:{client[1]}" if client else "unknown",
    )
    try:
        # The close frame (4408, as the outbox's own cap sends) goes behind what is queued: a
        # tab that catches up reads its frames and then why it was cut. autobahn aborts the
        # connection when the tab does not answer the close within its close handshake
        # timeout (1 s), which frees the buffer.
        protocol.sendClose(code=CLOSE_TOO_SLOW, reason="too slow: the socket stopped reading")
        return
    except Exception:
        log.exception("could not send the close frame; aborting at once")
    transport = protocol.transport
    abort = getattr(transport, "abortConnection", None)
    if abort is not None:
        abort()
    else:  # pragma: no cover - every Twisted stream transport has abortConnection
        transport.loseConnection()


def install() -> None:
    """Wrap daphne's WebSocketProtocol.serverSend with the bound; idempotent."""
    original = WebSocketProtocol.serverSend
    if getattr(original, "bounds_queued_bytes", False):
        return

    def serverSend(self: Any, content: Any, binary: bool = False) -> None:
        if getattr(self, "chat_cut_as_slow_reader", False):
            return  # aborted; daphne sends the app its disconnect on the next reactor turn
        queued = queued_bytes(self)
        if queued is not None:
            limit = limit_bytes()
            if queued > limit:
                _cut(self, queued, limit)
                return
        # autobahn applies daphne's *incoming* message limit (1 MiB) to outgoing messages too,
        # and raises: the final HTML of a long answer (~2.6 MB for 200,000 tokens) would kill
        # the consumer's send loop and leave the tab waiting for a `done` that never comes.
        # What we send is ours: lift the limit for this one synchronous write.
        incoming_limit = getattr(self, "maxMessagePayloadSize", 0)
        self.maxMessagePayloadSize = 0
        try:
            original(self, content, binary)
        finally:
            self.maxMessagePayloadSize = incoming_limit

    serverSend.bounds_queued_bytes = True  # type: ignore[attr-defined]
    WebSocketProtocol.serverSend = serverSend
