"""The stream log: an ordered, replayable log of each answer's chunks (Redis Streams or memory)."""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from chat.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

# The Done entry is written at the largest id a Redis stream can hold: it is always last, a
# second finish() is rejected (one Done per message), nothing can be appended after it, and a
# reader resuming from any `after` still reaches it.
DONE_ID = "18446744073709551615-0"
# Entries one XREAD returns at most while replaying; followers get whatever is new.
READ_BATCH = 1000
# Readers each hold a connection while blocked in XREAD; this caps them per process (and per
# event loop). Beyond it a reader waits up to READER_POOL_WAIT for a free connection, then
# fails with StreamLogUnavailable. Redis itself allows 10,000 clients by default.
DEFAULT_MAX_READERS = 1000
READER_POOL_WAIT = 5.0
# Slack on top of block_ms before a blocked XREAD is declared lost (a silent network failure).
READ_GRACE_SECONDS = 5.0
# Entries kept queued while Redis is unreachable; the oldest chunks go first beyond it.
DEFAULT_MAX_BACKLOG = 100_000
# How long finish() and flush() wait for Redis before giving up (the turn must not hang).
DEFAULT_WRITE_WAIT = 5.0
RETRY_BACKOFF_MIN = 0.05
RETRY_BACKOFF_MAX = 2.0


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
    async def exists(self, mid: str) -> bool:
        """Whether a log is held for `mid` (an answer streaming or recently finished)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Write what is queued (briefly), then release connections and tasks."""


def _check_block_ms(block_ms: int) -> None:
    # Redis reads BLOCK 0 as "forever"; a reader must always come back to check the key.
    if block_ms < 1:
        raise ValueError(f"block_ms must be at least 1, not {block_ms}")


# --- Redis Streams -----------------------------------------------------------------------------


@dataclass
class _ChunkOp:
    mid: str
    seq: int
    text: str


@dataclass
class _DoneOp:
    mid: str
    data: str  # the payload as JSON
    written: asyncio.Future[None]


@dataclass
class _FlushOp:
    written: asyncio.Future[None]


_Op = _ChunkOp | _DoneOp | _FlushOp


def _client_name(prefix: str, role: str) -> str:
    # CLIENT SETNAME refuses spaces; the name shows who is who in CLIENT LIST.
    return re.sub(r"[^\w:.-]", "_", f"{prefix}{role}")


class RedisStreamLog(StreamLog):
    """The stream log on Redis Streams, shared by every instance: one key per message.

    Entry ids encode the chunk's seq (`{seq+1}-0`), so a retried write is refused as a
    duplicate instead of stored twice, and a reader seeks straight to `after`.
    """

    def __init__(
        self,
        redis_url: str,
        prefix: str = "chat:",
        ttl: int = 3600,
        *,
        max_readers: int = DEFAULT_MAX_READERS,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        write_wait: float = DEFAULT_WRITE_WAIT,
    ) -> None:
        super().__init__()
        self._prefix = prefix
        self._ttl = ttl
        self._max_backlog = max_backlog
        self._write_wait = write_wait
        # The writer has its own connection so that hundreds of blocked readers never delay
        # the hot path; it retries on its own schedule, so redis-py must not retry as well.
        self._writer = aioredis.Redis.from_pool(
            aioredis.BlockingConnectionPool.from_url(
                redis_url,
                max_connections=1,
                timeout=None,
                decode_responses=True,
                socket_timeout=5.0,
                socket_connect_timeout=2.0,
                retry=Retry(NoBackoff(), 0),
                client_name=_client_name(prefix, "streamlog-writer"),
            )
        )
        # Readers block in XREAD for up to block_ms each, so no socket timeout (each call is
        # bounded with asyncio.timeout instead) and one connection per concurrent reader.
        # One immediate retry covers a pooled connection that Redis closed while idle.
        self._readers = aioredis.Redis.from_pool(
            aioredis.BlockingConnectionPool.from_url(
                redis_url,
                max_connections=max_readers,
                timeout=READER_POOL_WAIT,
                decode_responses=True,
                socket_timeout=None,
                socket_connect_timeout=2.0,
                retry=Retry(NoBackoff(), 1),
                client_name=_client_name(prefix, "streamlog-reader"),
            )
        )
        self._pending: list[_Op] = []
        self._wake = asyncio.Event()
        self._writer_task: asyncio.Task[None] | None = None
        self._closed = False

    def _key(self, mid: str) -> str:
        return f"{self._prefix}log:{mid}"

    # writing

    def append(self, mid: str, seq: int, text: str) -> None:
        if not self._call_on_loop(self._enqueue, _ChunkOp(mid, seq, text)):
            stats.dropped_entries += 1
            logger.error("stream log: append(%s, %d) outside an event loop; dropped", mid, seq)

    async def finish(self, mid: str, payload: dict[str, Any]) -> None:
        written = asyncio.get_running_loop().create_future()
        # Serialised here so that a payload that is not JSON fails in the turn that made it,
        # not in the shared writer where it would cost other messages their batch.
        self._call_on_loop(self._enqueue, _DoneOp(mid, json.dumps(payload), written))
        await self._wait_written(written, self._write_wait, f"done of {mid}")

    async def flush(self, timeout: float = DEFAULT_WRITE_WAIT) -> None:
        written = asyncio.get_running_loop().create_future()
        self._call_on_loop(self._enqueue, _FlushOp(written))
        await self._wait_written(written, timeout, "flush")

    async def _wait_written(self, written: asyncio.Future[None], timeout: float, what: str) -> None:
        try:
            # shield: giving up waiting must not cancel the write, which still happens later.
            await asyncio.wait_for(asyncio.shield(written), timeout)
        except TimeoutError:
            logger.warning("stream log: %s not written within %.1fs (Redis down?)", what, timeout)

    def _enqueue(self, op: _Op) -> None:
        if self._closed:
            if isinstance(op, _ChunkOp | _DoneOp):
                stats.dropped_entries += 1
            self._settle([op])
            return
        self._pending.append(op)
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.get_running_loop().create_task(
                self._run_writer(), name="stream-log-writer"
            )
        self._wake.set()

    async def _run_writer(self) -> None:
        """Drain the queue: all pending entries of all messages in one pipeline per wake-up."""
        backoff = 0.0
        failures = 0
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
            # Everything queued up to now (appends of the same tick included) goes together;
            # what is queued while this round trip is in flight goes in the next one.
            batch, self._pending = self._pending, []
            try:
                await self._write(batch)
            except (RedisError, OSError, TimeoutError) as exc:
                stats.write_errors += 1
                failures += 1
                if failures == 1:
                    logger.warning("stream log: write failed (%s); retrying", exc)
                # Put the batch back in front, in order: the entry ids make a rewrite of
                # anything that did land before the failure a refused duplicate.
                self._pending = batch + self._pending
                self._trim_backlog()
                backoff = min(max(backoff * 2, RETRY_BACKOFF_MIN), RETRY_BACKOFF_MAX)
                await asyncio.sleep(backoff)
                continue
            except Exception:
                # A bug, not an outage: retrying would loop forever on the same batch.
                logger.exception("stream log: dropping a batch of %d entries", len(batch))
                stats.dropped_entries += sum(isinstance(op, _ChunkOp | _DoneOp) for op in batch)
            if failures:
                logger.warning("stream log: writes recovered after %d failed attempts", failures)
            failures = 0
            backoff = 0.0
            self._settle(batch)

    async def _write(self, batch: list[_Op]) -> None:
        ops = [op for op in batch if not isinstance(op, _FlushOp)]
        if not ops:
            return
        touched: dict[str, None] = {}
        async with self._writer.pipeline(transaction=False) as pipe:
            for op in ops:
                key = self._key(op.mid)
                touched[key] = None
                if isinstance(op, _ChunkOp):
                    pipe.xadd(key, {"s": op.seq, "t": op.text}, id=f"{op.seq + 1}-0")
                else:
                    pipe.xadd(key, {"d": op.data}, id=DONE_ID)
            # Every write refreshes the TTL: a finished log lives `ttl` after its Done, and the
            # log of a turn whose owner died mid-answer goes away `ttl` after its last chunk.
            for key in touched:
                pipe.expire(key, self._ttl)
            results = await self._execute(pipe)
        for op, result in zip(ops, results, strict=False):
            if isinstance(result, ResponseError):
                stats.rejected_entries += 1
                # "equal or smaller than the target stream top item": a retried duplicate,
                # a seq out of order, or an entry after Done. Anything else is worth a warning.
                level = logging.DEBUG if "smaller" in str(result) else logging.WARNING
                logger.log(level, "stream log: %s refused an entry: %s", op.mid, result)
        for result in results[len(ops) :]:
            if isinstance(result, Exception):  # an EXPIRE refused: the entries are written
                logger.warning("stream log: could not set a TTL: %s", result)

    async def _execute(self, pipe: Pipeline) -> list[Any]:
        """One round trip to Redis (a seam the tests count)."""
        return await pipe.execute(raise_on_error=False)

    def _trim_backlog(self) -> None:
        excess = len(self._pending) - self._max_backlog
        if excess <= 0:
            return
        # While Redis is away the oldest chunks go first; Done entries and flush markers stay
        # (they are few and someone awaits them). Watchers see a gap; the DB has the answer.
        kept: list[_Op] = []
        for op in self._pending:
            if excess > 0 and isinstance(op, _ChunkOp):
                excess -= 1
                stats.dropped_entries += 1
                continue
            kept.append(op)
        self._pending = kept

    @staticmethod
    def _settle(batch: list[_Op]) -> None:
        for op in batch:
            if isinstance(op, _DoneOp | _FlushOp) and not op.written.done():
                op.written.set_result(None)

    # reading

    async def read(
        self, mid: str, after: int = -1, *, block_ms: int = 15000
    ) -> AsyncGenerator[Entry, None]:
        _check_block_ms(block_ms)
        key = self._key(mid)
        last_seq = max(after, -1)
        # Reading by entry id is what makes the seam exact: XREAD returns entries strictly
        # after the last id seen, whether they were written before or after we started.
        last_id = f"{last_seq + 1}-0"
        while True:
            reply = await self._call(
                self._readers.xread({key: last_id}, count=READ_BATCH, block=block_ms),
                block_ms / 1000 + READ_GRACE_SECONDS,
            )
            if not reply:
                # Nothing for block_ms: carry on while the log exists (a slow answer), end when
                # it never appeared or has expired — the caller asks the DB what happened.
                if await self._call(self._readers.exists(key), READ_GRACE_SECONDS):
                    continue
                return
            for entry_id, fields in _entries_of(reply, key):
                last_id = entry_id
                if "d" in fields:
                    yield Done(json.loads(fields["d"]))
                    return
                seq = int(fields["s"])
                if seq <= last_seq:  # cannot happen with seq-derived ids; kept for safety
                    continue
                last_seq = seq
                yield Chunk(seq, fields["t"])

    async def exists(self, mid: str) -> bool:
        return bool(await self._call(self._readers.exists(self._key(mid)), READ_GRACE_SECONDS))

    async def _call(self, command: Any, timeout: float) -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await command
        except (RedisError, OSError, TimeoutError) as exc:
            stats.read_errors += 1
            raise StreamLogUnavailable(f"stream log unavailable: {exc}") from exc

    async def aclose(self) -> None:
        if self._pending:
            await self.flush(timeout=1.0)
        self._closed = True
        if self._writer_task is not None:
            await cancel_and_wait(self._writer_task)
            self._writer_task = None
        dropped, self._pending = self._pending, []
        stats.dropped_entries += sum(isinstance(op, _ChunkOp | _DoneOp) for op in dropped)
        self._settle(dropped)
        await self._writer.aclose()
        await self._readers.aclose()


def _entries_of(reply: Any, key: str) -> list[tuple[str, dict[str, str]]]:
    """The entries of `key` in an XREAD reply (a list in RESP2, a dict in RESP3)."""
    if isinstance(reply, dict):
        streams = reply.get(key) or []
        return list(streams[0]) if streams and isinstance(streams[0], list) else list(streams)
    for name, entries in reply:
        if name == key:
            return list(entries)
    return []


# --- memory ------------------------------------------------------------------------------------


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
        _check_block_ms(block_ms)
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

    async def exists(self, mid: str) -> bool:
        self._sweep()
        log = self._logs.get(mid)
        return log is not None and log.expires_at > self._clock()

    async def aclose(self) -> None:
        self._logs.clear()


# --- one per process and event loop ------------------------------------------------------------

_instances: dict[asyncio.AbstractEventLoop, StreamLog] = {}
_instances_lock = threading.Lock()


def _build_stream_log() -> StreamLog:
    prefix: str = getattr(settings, "CHAT_REDIS_PREFIX", "chat:")
    ttl: int = getattr(settings, "CHAT_STREAM_LOG_TTL", 3600)
    if settings.REDIS_URL:
        max_readers: int = getattr(settings, "CHAT_STREAM_LOG_MAX_READERS", DEFAULT_MAX_READERS)
        return RedisStreamLog(settings.REDIS_URL, prefix, ttl, max_readers=max_readers)
    return MemoryStreamLog(ttl)


def get_stream_log() -> StreamLog:
    """This process's stream log for the running event loop, chosen by REDIS_URL.

    One per loop because redis-py's asyncio connections belong to the loop that made them
    (tests run many loops; production runs one).
    """
    loop = asyncio.get_running_loop()
    with _instances_lock:
        for closed in [other for other in _instances if other.is_closed()]:
            del _instances[closed]
        log = _instances.get(loop)
        if log is None:
            log = _instances[loop] = _build_stream_log()
        return log


async def close_stream_log() -> None:
    """Close and forget the running loop's stream log (shutdown, test teardown)."""
    with _instances_lock:
        log = _instances.pop(asyncio.get_running_loop(), None)
    if log is not None:
        await log.aclose()
