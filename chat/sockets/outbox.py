"""A socket's one ordered outbox: frames, replays and a close, sent in the order they were queued.

Only the outbox writes to a socket. A frame is queued without waiting; past
CHAT_SEND_BUFFER_FRAMES queued items the socket is condemned as a slow reader (close 4408: the
tab reconnects and resumes). A replay (a resume's chunks and blocks) is one item however long,
its frames made as they are sent, with a pause every REPLAY_PAUSE_BYTES so the server writes
them out and serves every other socket meanwhile: resuming a long answer is never mistaken for
a tab that stopped reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from autobahn.exception import Disconnected
from django.conf import settings

from chat import protocol

log = logging.getLogger(__name__)

# Bytes of a replay sent before the sender lets the event loop run (daphne's `send` never
# waits: without a pause a replay would sit whole in daphne's buffer, past CHAT_SEND_BUFFER_BYTES
# for a long answer, and hold the loop while it is queued).
REPLAY_PAUSE_BYTES = 64 * 1024


class Outbox:
    """The outbox half of ChatConsumer (a mixin: it sends with the consumer's `send`)."""

    outbox: deque[str | int | Iterator[str]]  # an int is a close code, sent in order
    sealed: bool  # a close is queued or sent: no more frames are taken
    # The task that drains the outbox, only while it has frames: an idle socket holds no task
    # and no event (memory per idle socket, docs/benchmarks.md).
    sender: asyncio.Task[None] | None

    if TYPE_CHECKING:

        async def send(
            self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
        ) -> None: ...

        async def close(self, code: int | None = None, reason: str | None = None) -> None: ...

    def open_outbox(self) -> None:
        self.outbox = deque()
        self.sealed = False
        self.sender = None

    def push(self, frame: str) -> None:
        """Queue a frame (turns call this from their flush); never blocks."""
        self._queue(frame)

    def push_replay(self, frames: Iterator[str]) -> None:
        """Queue a resume's replay: one item, its frames made as they are sent."""
        self._queue(frames)

    def _queue(self, item: str | Iterator[str]) -> None:
        if self.sealed:
            return  # its close is queued; the tab resumes from the log once it reconnects
        if len(self.outbox) >= settings.CHAT_SEND_BUFFER_FRAMES:
            # A tab that stops reading must not grow our memory without bound (PITFALLS).
            log.warning("closing a socket whose outbox is full (%d frames)", len(self.outbox))
            self.outbox.clear()
            self.close_after_sending(protocol.CLOSE_TOO_SLOW)
            return
        self.outbox.append(item)
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._drain())

    def close_after_sending(self, code: int) -> None:
        if self.sealed:
            return
        self.sealed = True
        self.outbox.append(code)
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Send what the outbox holds, in order, then end (the next push starts another)."""
        outbox = self.outbox
        try:
            while outbox:
                item = outbox.popleft()
                if isinstance(item, int):
                    outbox.clear()
                    await self.close(code=item)
                    return
                if isinstance(item, str):
                    await self.send(text_data=item)
                    continue
                sent = 0
                for frame in item:
                    if self.sealed:
                        break  # cut, or logged out: nothing more of the replay
                    await self.send(text_data=frame)
                    sent += len(frame)
                    if sent >= REPLAY_PAUSE_BYTES:
                        sent = 0
                        await asyncio.sleep(0)  # the server writes it out; others run
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # A socket that cannot send must not stay open and silent: close it; the tab
            # reconnects and resumes from the stream log. A client that went away while we
            # sent is ordinary (one line); anything else is an error worth its traceback.
            if isinstance(error, Disconnected):
                log.info("socket closed by the client while sending; closing it")
            else:
                log.exception("socket send failed; closing it")
            self.sealed = True
            outbox.clear()
            with contextlib.suppress(Exception):
                await self.close(code=protocol.CLOSE_INTERNAL)
        finally:
            self.sender = None
