"""The stream log in this process's memory: the same semantics as Redis, for one process."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from chat.turns.streamlog.base import (
    DEFAULT_WRITE_WAIT,
    Chunk,
    Done,
    Entry,
    StreamLog,
    check_block_ms,
    stats,
)

logger = logging.getLogger("chat.turns.streamlog")


@dataclass
class _MemoryLog:
    chunks: list[Chunk] = field(default_factory=list)
    done: Done | None = None
    expires_at: float = 0.0
    # Replaced on every write: followers wait on the event they saw, writers set it.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class MemoryStreamLog(StreamLog):
    """The stream log in this process's memory (no REDIS_URL): same semantics, one process."""

    def __init__(self, ttl: float = 3600, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._ttl = ttl
        self._clock = clock
        self._logs: dict[str, _MemoryLog] = {}
        self._created = asyncio.Event()
        self._next_sweep = 0.0

    def append(self, mid: str, seq: int, text: str) -> None:
        if not self._call_on_loop(self._add, mid, Chunk(seq, text)):
            stats.dropped_entries += 1
            logger.error("stream log: append(%s, %d) outside an event loop; dropped", mid, seq)

    async def finish(self, mid: str, payload: dict[str, Any]) -> None:
        self._call_on_loop(self._add, mid, Done(payload))

    async def reopen(self, mid: str) -> None:
        self._logs.pop(mid, None)

    async def flush(self, timeout: float = DEFAULT_WRITE_WAIT) -> None:
        return None  # appends are applied at once

    def _add(self, mid: str, entry: Entry) -> None:
        self._sweep()
        log = self._logs.get(mid)
        if log is None:
            log = self._logs[mid] = _MemoryLog()
            self._created.set()
            self._created = asyncio.Event()
        # Same rules as Redis: nothing after Done, seqs strictly increasing.
        if log.done is not None or (
            isinstance(entry, Chunk) and log.chunks and entry.seq <= log.chunks[-1].seq
        ):
            stats.rejected_entries += 1
            logger.debug("stream log: %s refused %r", mid, entry)
            return
        if isinstance(entry, Chunk):
            log.chunks.append(entry)
        else:
            log.done = entry
        log.expires_at = self._clock() + self._ttl
        log.notify()

    def _sweep(self) -> None:
        """Forget logs idle for ttl (finished, or abandoned by a crashed turn); at most 1/s."""
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(1.0, self._ttl)
        for mid in [mid for mid, log in self._logs.items() if log.expires_at <= now]:
            del self._logs[mid]

    async def read(
        self, mid: str, after: int = -1, *, block_ms: int = 15000
    ) -> AsyncGenerator[Entry, None]:
        check_block_ms(block_ms)
        self._sweep()
        loop = asyncio.get_running_loop()
        last_seq = max(after, -1)
        log = self._logs.get(mid)
        deadline = loop.time() + block_ms / 1000
        while log is None:
            created = self._created
            try:
                await asyncio.wait_for(created.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return
            log = self._logs.get(mid)
        # The index into the chunk list plays the part of the Redis entry id.
        index = bisect.bisect_right(log.chunks, last_seq, key=lambda chunk: chunk.seq)
        while True:
            while index < len(log.chunks):
                chunk = log.chunks[index]
                index += 1
                if chunk.seq > last_seq:
                    last_seq = chunk.seq
                    yield chunk
            if log.done is not None:
                yield log.done
                return
            changed = log.changed
            try:
                await asyncio.wait_for(changed.wait(), block_ms / 1000)
            except TimeoutError:
                self._sweep()
                if self._logs.get(mid) is not log:
                    return  # expired while idle, as a Redis key would

    async def chunks(self, mid: str, after: int = -1) -> list[Chunk]:
        self._sweep()
        log = self._logs.get(mid)
        return [chunk for chunk in log.chunks if chunk.seq > after] if log is not None else []

    async def exists(self, mid: str) -> bool:
        self._sweep()
        log = self._logs.get(mid)
        return log is not None and log.expires_at > self._clock()

    async def aclose(self) -> None:
        self._logs.clear()
