"""An answer's `block` frames while it streams: a LiveRenderer fed its chunks, as cheaply as may be.

Blocks depend on the answer's text alone (chat/rendering/live.py), so the turn, a follower on
another instance and a tab that resumes all derive the same frames from the same text; none is
stored. Small work runs on the event loop (most chunks complete no line and cost a list
append); a chunk that may render a large block goes to a worker thread, so highlighting a long
code block does not hold up every other socket of the process. A renderer that fails is
logged and switched off: the answer then ends with one swap of its whole HTML, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from asgiref.sync import sync_to_async

from chat import protocol
from chat.rendering import Block, LiveRenderer

log = logging.getLogger(__name__)

# Above this many characters in the open block, a chunk that completes a line is rendered in a
# worker thread (a thread hop costs ~100 µs; rendering 4,000 characters of code, a few ms).
INLINE_MAX_CHARS = 4000
# Math costs far more: latex2mathml takes ~1 ms a formula and 15-30 µs a character, so a
# 4,000-character formula held the loop 60-100 ms, and a short line of `$a$ $b$ …` tens of
# ms; an answer of such blocks stalled every socket of the process again and again (hostile
# review). An open block that may hold math is always rendered in a worker thread.
MATH_MARKS = ("$", "\\(", "\\[")


class LiveBlocks:
    """The block frames of one answer, from its chunk texts fed in order.

    The turn `push`es each chunk as it is sent (synchronously, on the loop) and gets the
    frames through `send`, in order; `finish` sends the last ones. A follower `await`s `feed`.
    """

    def __init__(self, mid: str, send: Callable[[list[str]], None] | None = None) -> None:
        self.mid = mid
        self.count = 0  # blocks made so far
        self._send = send
        self._renderer: LiveRenderer | None = LiveRenderer()
        self._final_html: str | None = None
        self._backlog: list[str] | None = None  # not None: a worker thread renders
        self._worker: asyncio.Task[None] | None = None

    @property
    def text(self) -> str:
        """The answer as fed so far ("" once switched off)."""
        return self._renderer.text if self._renderer is not None else ""

    @property
    def live(self) -> bool:
        """Does it still make blocks (not switched off by a gap or a failure)?"""
        return self._renderer is not None

    def stop(self) -> None:
        """Make no more blocks (the text fed has a gap): the answer ends with one swap."""
        self._renderer = None

    async def prime(self, text: str) -> tuple[list[Block], list[str]]:
        """An answer going on (Continue): take its earlier text first, sending nothing; return
        the blocks it makes final, and their frames.

        The earlier text's last block was final only because the text ended there; fed here it
        stays open, so the continuation extends it (a paragraph stopped mid-sentence goes on
        in the same paragraph) and the blocks are those of the whole answer's text, the same
        as a follower or a reload derives.
        """
        renderer = self._renderer
        if renderer is None or not text:
            return [], []
        try:
            if self.inline(text):
                blocks = renderer.feed(text)
            else:
                blocks = await sync_to_async(renderer.feed, thread_sensitive=False)(text)
        except Exception:
            log.exception("live rendering of %s failed; it ends with one swap", self.mid)
            self._renderer = None
            return [], []
        return blocks, self._frames(blocks)

    def inline(self, text: str) -> bool:
        """May `feed_now(text)` run on the event loop (little work)?"""
        renderer = self._renderer
        if renderer is None or ("\n" not in text and "\r" not in text):
            return True
        if renderer.open_chars + len(text) > INLINE_MAX_CHARS:
            return False
        return not any(mark in text for mark in MATH_MARKS) and not renderer.open_text_has(
            *MATH_MARKS
        )

    def feed_now(self, text: str) -> list[str]:
        """The block frames that `text`, the next chunk, makes final (here, synchronously)."""
        renderer = self._renderer
        if renderer is None:
            return []
        try:
            return self._frames(renderer.feed(text))
        except Exception:
            log.exception("live rendering of %s failed; it ends with one swap", self.mid)
            self._renderer = None
            return []

    async def feed(self, text: str) -> list[str]:
        """`feed_now`, in a worker thread when it may be a lot of work."""
        if self.inline(text):
            return self.feed_now(text)
        return await sync_to_async(self.feed_now, thread_sensitive=False)(text)

    def push(self, text: str) -> None:
        """Feed the next chunk without waiting; its frames go to `send`, in order."""
        if self._backlog is not None:  # a worker renders: keep the order
            self._backlog.append(text)
        elif self.inline(text):
            self._sent(self.feed_now(text))
        else:
            self._backlog = [text]
            self._worker = asyncio.get_running_loop().create_task(
                self._work(), name=f"render {self.mid}"
            )

    async def _work(self) -> None:
        try:
            while self._backlog:
                text = "".join(self._backlog)
                self._backlog.clear()
                self._sent(await self.feed(text))
        finally:
            self._backlog = None

    def _sent(self, frames: list[str]) -> None:
        if frames and self._send is not None:
            self._send(frames)

    def finish_now(self) -> list[str]:
        """The answer is complete: the block frames of what is left (the last block)."""
        renderer = self._renderer
        if renderer is None:
            return []
        try:
            frames = self._frames(renderer.finish())
            if renderer.whole_matches:
                self._final_html = renderer.final_html()
            return frames
        except Exception:
            log.exception("live rendering of %s failed at its end; it ends with one swap", self.mid)
            self._renderer = None
            return []

    async def finish(self) -> list[str]:
        """Wait for the pushed chunks, then render and send the rest (in a worker thread when
        it may be a lot of work)."""
        if self._worker is not None:
            with contextlib.suppress(Exception):  # _work cannot raise; be sure anyway
                await self._worker
        if self._finishes_inline():
            frames = self.finish_now()  # a small last block: cheaper than the thread hop
        else:
            frames = await sync_to_async(self.finish_now, thread_sensitive=False)()
        self._sent(frames)
        return frames

    def _finishes_inline(self) -> bool:
        """May `finish_now` run on the event loop? Its work is the open tail's render, so the
        rule of `inline`: at most INLINE_MAX_CHARS of it, and no math."""
        renderer = self._renderer
        if renderer is None:
            return True
        return renderer.open_chars <= INLINE_MAX_CHARS and not renderer.open_text_has(*MATH_MARKS)

    @property
    def final_html(self) -> str | None:
        """After `finish`: the answer's HTML when it is exactly its blocks joined, else None
        (a link reference definition, or a failure: render the whole answer instead)."""
        return self._final_html if self._renderer is not None else None

    def _frames(self, blocks: list[Block]) -> list[str]:
        self.count += len(blocks)
        return [protocol.block(self.mid, b.index, b.start, b.end, b.html) for b in blocks]
