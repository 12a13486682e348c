"""The stream log on Redis Streams, shared by every instance: one key per message."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, ResponseError

from chat.loops import cancel_and_wait
from chat.redis_clients import redis_client
from chat.turns.streamlog.base import (
    DEFAULT_WRITE_WAIT,
    Chunk,
    Done,
    Entry,
    StreamLog,
    StreamLogUnavailable,
    check_block_ms,
    stats,
)

logger = logging.getLogger("chat.turns.streamlog")

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
RETRY_BACKOFF_MIN = 0.05
RETRY_BACKOFF_MAX = 2.0


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
        self._writer = redis_client(
            "streamlog-writer",
            url=redis_url,
            prefix=prefix,
            max_connections=1,
            pool_timeout=None,
            socket_timeout=5.0,
            retries=0,
        )
        # Readers block in XREAD for up to block_ms each, so no socket timeout (each call is
        # bounded with asyncio.timeout instead) and one connection per concurrent reader.
        # One immediate retry covers a pooled connection that Redis closed while idle.
        self._readers = redis_client(
            "streamlog-reader",
            url=redis_url,
            prefix=prefix,
            max_connections=max_readers,
            pool_timeout=READER_POOL_WAIT,
            socket_timeout=None,
            retries=1,
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

    async def reopen(self, mid: str) -> None:
        # Its Done sits at the largest id a stream holds, so nothing can follow it: the key
        # goes, and the continuation writes the answer's chunks again from seq 0.
        await self._call(self._writer.delete(self._key(mid)), self._write_wait)

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
        check_block_ms(block_ms)
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

    async def chunks(self, mid: str, after: int = -1) -> list[Chunk]:
        key = self._key(mid)
        found: list[Chunk] = []
        start = f"{max(after, -1) + 2}-0"  # the entry id of seq after + 1
        while True:
            entries = await self._call(
                self._readers.xrange(key, min=start, max="+", count=READ_BATCH),
                READ_GRACE_SECONDS,
            )
            for _entry_id, fields in entries:
                if "d" in fields:
                    return found
                found.append(Chunk(int(fields["s"]), fields["t"]))
            if len(entries) < READ_BATCH:
                return found
            start = "(" + entries[-1][0]  # exclusive: after the last entry read

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
