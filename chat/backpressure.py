"""Bound the bytes daphne holds for a websocket whose client stopped reading (daphne #170).

Why this exists: under daphne, a consumer's `await self.send(...)` never waits. daphne hands
every frame to autobahn, which writes it to Twisted's transport, and the transport buffers
whatever the kernel will not take — without limit (daphne issue #170, open). So the socket's
own outbox cap (`CHAT_SEND_BUFFER_FRAMES`, close 4408 in chat/consumers.py) never fills
under daphne, and a tab that stops reading (its TCP window is full: a frozen tab, a laptop
that went to sleep, a hostile client) grows this process's memory by everything its turns
send it — and about twice that in memory (the encoded payload, the frame, Twisted's joined
buffer): a 200,000-token answer is ~1.3 MB of chunk frames plus ~2.6 MB of final HTML, and a
tab that asked for six of them grew daphne by ~54 MiB (tests/test_backpressure.py).

What we do: just before daphne writes a frame of a websocket, we look at how many bytes are
already waiting in user space for that connection — autobahn's send queue plus Twisted's
transport buffer (`FileDescriptor.dataBuffer[offset:]` plus `_tempDataBuffer`, whose length
Twisted keeps in `_tempDataLen`). When that is over `CHAT_SEND_BUFFER_BYTES`:

- the frame is dropped, every later frame too, and a close frame with code 4408 is queued
  behind what is buffered; the client cannot answer it while it does not read, so after
  autobahn's close handshake timeout (1 s) the TCP connection is **aborted** and the buffered
  bytes are freed (the client sees a reset; one that catches up in time reads 4408);
- daphne gives the application its normal `websocket.disconnect` (code 1006), so the consumer
  cleans up as for any dropped tab: the turns go on, the answers are completed and saved, and
  a reconnecting tab resumes them from the stream log;
- a warning is logged once for that socket and `chat_ws_slow_reader_closed_total` counts it.

So what one slow reader can hold in this process is `CHAT_SEND_BUFFER_BYTES` plus one frame
(the check is made before a frame is written, so one frame — at most the largest frame we
send, e.g. the final HTML of a long answer — can land on top of the limit). The limit must be
well above what a reader that *does* read can have queued at one moment: frames written in
one burst (an answer's final HTML followed by its `done`, a resume replaying a long answer, a
branch switch re-rendering a long conversation) sit in Twisted's buffer until the reactor
writes them, at most 128 KiB per turn of the event loop. The default, 4 MiB, is above the
biggest such burst of one answer (the final HTML of the demo's longest, 200,000 tokens, is
~2.6 MB; real models' usual `max_tokens` make a tenth of that). Two very long answers ending
at the same instant on one socket could still pass it: the tab then resumes them.

The kernel's send buffer is deliberately left alone (no `SO_SNDBUF`): it is kernel memory,
bounded per socket by `net.ipv4.tcp_wmem`'s maximum (4 MiB by default) and for the whole
host by `net.ipv4.tcp_mem` (under pressure the kernel shrinks it); it is freed by the abort;
and fixing `SO_SNDBUF` turns off its autotuning, which would cap the throughput of every
healthy far-away client to buffer / round-trip time. The kernel's buffer only delays the cut
by what it absorbs (~2 MB in the test, whose client's receive window was closed).

The same wrapper fixes a second daphne-level fault on this path: autobahn applies daphne's
*incoming* message limit (1 MiB, `websocket_max_message_size`) to outgoing messages as well,
and raises `PayloadExceededError` from `sendMessage`. That exception ended the consumer's send
loop: the final HTML of an answer over ~0.5 MB never went out, nor anything after it, and the
tab waited for a `done` forever. What the application sends is not a client's input, so the
limit is lifted for our own writes.

Installed from chat.shutdown.install (so only under daphne), on daphne's
`WebSocketProtocol.serverSend`, once (the wrapper is marked).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

DEFAULT_LIMIT_BYTES = 4 * 1024 * 1024
CLOSE_TOO_SLOW = 4408  # the app's "too slow" close code (chat/consumers.py)


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
    return int(getattr(settings, "CHAT_SEND_BUFFER_BYTES", DEFAULT_LIMIT_BYTES))


def _cut(protocol: Any, queued: int, limit: int) -> None:
    """Abort a slow reader's connection: once per socket, logged and counted."""
    from chat import metrics

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
    from daphne.ws_protocol import WebSocketProtocol

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
