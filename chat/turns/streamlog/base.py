"""The stream log's contract: entries (chunks and the done), the interface, and its counters.

The stream log is an ordered, replayable log of each answer's chunks that the turn appends to
and any watcher — another tab, a reconnected tab, a tab on another instance — replays and
follows. Two implementations: Redis Streams (shared by every instance) and memory (one
process, no REDIS_URL).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

# How long finish() and flush() wait for Redis before giving up (the turn must not hang).
DEFAULT_WRITE_WAIT = 5.0


@dataclass(frozen=True)
class Chunk:
    """One piece of an answer; joined in seq order the chunks are the whole answer."""

    seq: int
    text: str


@dataclass(frozen=True)
class Done:
    """The end of an answer: the `done` frame's fields (status, seq = chunk count, usage …)."""

    payload: dict[str, Any]


Entry = Chunk | Done


class StreamLogUnavailable(Exception):
    """The stream log's backend cannot be reached; the caller turns this into an error frame."""


@dataclass
class StreamLogStats:
    """Process-wide counters, so failures of a best-effort log are visible in metrics."""

    write_errors: int = 0  # round trips to Redis that failed (their entries are retried)
    dropped_entries: int = 0  # entries given up on: backlog overflow, closed log, no loop
    rejected_entries: int = 0  # entries Redis refused: duplicate/out-of-order seq, after done
    read_errors: int = 0  # reads that raised StreamLogUnavailable


stats = StreamLogStats()


class StreamLog(ABC):
    """Per-message chunk logs that the turn appends to and any watcher replays and follows."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def _call_on_loop(self, fn: Callable[..., None], *args: Any) -> bool:
        """Run fn now if we are on the log's loop, else hand it over; False if impossible.

        append() is called from the turn's sync flush callback, normally on the loop, but a
        sync caller in another thread must not touch asyncio objects directly.
        """
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is None:
            self._loop = running
        # A log belongs to the loop it was first used on (its connections and events do);
        # get_stream_log() hands every loop its own.
        if self._loop is None or self._loop.is_closed():
            return False
        if running is self._loop:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)
        return True

    @abstractmethod
    def append(self, mid: str, seq: int, text: str) -> None:
        """Queue chunk `seq` of message `mid`; never blocks and never raises."""

    @abstractmethod
    async def finish(self, mid: str, payload: dict[str, Any]) -> None:
        """Write the Done entry after the message's chunks and start its TTL."""

    @abstractmethod
    async def reopen(self, mid: str) -> None:
        """Forget the log of an answer about to be continued: its continuation writes it again
        from seq 0 (the earlier chunks first), so a follower replays it whole and then live."""

    @abstractmethod
    async def flush(self, timeout: float = DEFAULT_WRITE_WAIT) -> None:
        """Wait until everything queued so far is written (or `timeout` passed)."""

    @abstractmethod
    def read(
        self, mid: str, after: int = -1, *, block_ms: int = 15000
    ) -> AsyncGenerator[Entry, None]:
        """Replay chunks with seq > after, follow live ones, end with Done.

        Ends without Done when the log does not exist for block_ms (never written, expired).
        """

    @abstractmethod
    async def chunks(self, mid: str, after: int = -1) -> list[Chunk]:
        """The chunks held now with seq > after, in order, without waiting for more: what a
        dead turn had sent (the reaper keeps them). Raises StreamLogUnavailable."""

    @abstractmethod
    async def exists(self, mid: str) -> bool:
        """Whether a log is held for `mid` (an answer streaming or recently finished)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Write what is queued (briefly), then release connections and tasks."""


def check_block_ms(block_ms: int) -> None:
    # Redis reads BLOCK 0 as "forever"; a reader must always come back to check the key.
    if block_ms < 1:
        raise ValueError(f"block_ms must be at least 1, not {block_ms}")
