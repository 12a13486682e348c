"""The stream log: ordered, exactly-once, resumable replay of an answer, on Redis and in memory."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.asyncio.client import Pipeline

from chat.turns import streamlog
from chat.turns.streamlog import (
    Chunk,
    Done,
    Entry,
    MemoryStreamLog,
    RedisStreamLog,
    StreamLog,
    StreamLogUnavailable,
    get_stream_log,
    stream_logs,
)

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A real refused connection: nothing listens on port 1.
UNREACHABLE_URL = "redis://127.0.0.1:1/0"
DONE = {"status": "complete", "usage": {"prompt_tokens": 3, "completion_tokens": 5}}


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    prefix = f"test-streamlog-{uuid.uuid4().hex[:10]}:"
    yield prefix
    with redis.Redis.from_url(REDIS_URL) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def stream_log(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[StreamLog]:
    log: StreamLog
    if request.param == "redis":
        log = RedisStreamLog(REDIS_URL, prefix, ttl=3600)
    else:
        log = MemoryStreamLog(ttl=3600)
    yield log
    await log.aclose()


async def collect(entries: AsyncIterator[Entry]) -> list[Entry]:
    return [entry async for entry in entries]


def text_of(entries: list[Entry]) -> str:
    return "".join(entry.text for entry in entries if isinstance(entry, Chunk))


def seqs_of(entries: list[Entry]) -> list[int]:
    return [entry.seq for entry in entries if isinstance(entry, Chunk)]


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll until condition holds; a bound on a wait, not an assertion on speed."""
    async with asyncio.timeout(timeout):
        # The condition is Redis's view (CLIENT LIST, PUBSUB NUMSUB): no event to wait on.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert condition(), what


def redis_clients(name: str) -> list[dict[str, Any]]:
    with redis.Redis.from_url(REDIS_URL) as client:
        return [c for c in client.client_list() if c.get("name") == name]


async def readers_blocked(prefix: str, count: int) -> None:
    """Wait until `count` reader connections of this prefix sit blocked in XREAD on Redis."""
    name = f"{prefix}streamlog-reader"

    def blocked() -> int:
        return sum("b" in c["flags"] for c in redis_clients(name))

    await eventually(lambda: blocked() >= count, f"{count} blocked readers")


async def reader_is_waiting(log: StreamLog, prefix: str) -> None:
    if isinstance(log, RedisStreamLog):
        await readers_blocked(prefix, 1)
    else:
        for _ in range(5):
            await asyncio.sleep(0)


async def test_a_reader_from_the_start_gets_every_chunk_in_order_then_done(
    stream_log: StreamLog,
) -> None:
    for seq in range(300):
        stream_log.append("m1", seq, f"{seq} ")
    await stream_log.finish("m1", {**DONE, "seq": 300})

    entries = await collect(stream_log.read("m1", -1, block_ms=1000))

    assert seqs_of(entries) == list(range(300))
    assert text_of(entries) == "".join(f"{seq} " for seq in range(300))
    assert entries[-1] == Done({**DONE, "seq": 300})


async def test_a_reader_after_k_gets_only_the_chunks_after_k(stream_log: StreamLog) -> None:
    for seq in range(50):
        stream_log.append("m1", seq, f"<{seq}>")
    await stream_log.finish("m1", {**DONE, "seq": 50})

    entries = await collect(stream_log.read("m1", after=36, block_ms=1000))

    assert seqs_of(entries) == list(range(37, 50))
    assert isinstance(entries[-1], Done)
    # Resuming past the last chunk still learns how the answer ended.
    assert await collect(stream_log.read("m1", after=49, block_ms=1000)) == [
        Done({**DONE, "seq": 50})
    ]


async def test_a_reader_that_starts_before_any_append_gets_everything_live(
    stream_log: StreamLog, prefix: str
) -> None:
    reader = asyncio.create_task(collect(stream_log.read("m1", block_ms=5000)))
    await reader_is_waiting(stream_log, prefix)

    for frame in range(10):
        for seq in range(frame * 3, frame * 3 + 3):
            stream_log.append("m1", seq, f"{seq},")
        await stream_log.flush()
    await stream_log.finish("m1", {**DONE, "seq": 30})

    entries = await reader
    assert seqs_of(entries) == list(range(30))
    assert entries[-1] == Done({**DONE, "seq": 30})


async def test_readers_joining_mid_stream_see_no_gap_and_no_duplicate_at_the_seam(
    stream_log: StreamLog,
) -> None:
    rng = random.Random(20251129)
    total = 2000
    texts = [f"<{seq}>" for seq in range(total)]
    # Each reader joins once the writer has queued `at` chunks, asking for seq > after; some
    # ask from just around the join point (the seam), some from far behind or ahead of it.
    plans = [(rng.randrange(total), rng.randrange(-1, total)) for _ in range(6)]
    plans += [(at, max(-1, at + rng.randrange(-3, 3))) for at in rng.sample(range(total), 6)]
    plans += [(0, -1), (total, total - 1)]
    reached: dict[int, asyncio.Event] = {at: asyncio.Event() for at, _ in plans}

    async def write() -> None:
        for seq, text in enumerate(texts):
            if seq in reached:
                reached[seq].set()
            stream_log.append("m1", seq, text)
            if rng.random() < 0.2:
                await asyncio.sleep(0)  # let the log's writer and the readers run mid-stream
        if total in reached:
            reached[total].set()
        await stream_log.finish("m1", {**DONE, "seq": total})

    async def join_and_read(at: int, after: int) -> list[Entry]:
        await reached[at].wait()
        return await collect(stream_log.read("m1", after, block_ms=10_000))

    readers = [asyncio.create_task(join_and_read(at, after)) for at, after in plans]
    await write()
    results = await asyncio.gather(*readers)

    for (at, after), entries in zip(plans, results, strict=True):
        assert seqs_of(entries) == list(range(after + 1, total)), (at, after)
        assert text_of(entries) == "".join(texts[after + 1 :]), (at, after)
        assert entries[-1] == Done({**DONE, "seq": total})


async def test_duplicate_and_out_of_order_appends_are_stored_once(stream_log: StreamLog) -> None:
    for seq, text in [(0, "a"), (1, "b"), (1, "B"), (0, "A"), (2, "c")]:
        stream_log.append("m1", seq, text)
    await stream_log.finish("m1", DONE)

    entries = await collect(stream_log.read("m1", block_ms=1000))

    assert seqs_of(entries) == [0, 1, 2]
    assert text_of(entries) == "abc"


async def test_nothing_is_appended_after_done(stream_log: StreamLog) -> None:
    stream_log.append("m1", 0, "a")
    await stream_log.finish("m1", {**DONE, "seq": 1})
    stream_log.append("m1", 1, "late")
    await stream_log.finish("m1", {"status": "failed", "seq": 2})

    entries = await collect(stream_log.read("m1", block_ms=1000))

    assert entries == [Chunk(0, "a"), Done({**DONE, "seq": 1})]


async def test_a_reopened_log_is_written_again_and_read_whole_with_its_new_done(
    stream_log: StreamLog,
) -> None:
    # Continue (docs/protocol.md): the answer's log goes, and its turn writes the earlier
    # chunks again from seq 0, then its own, then a new Done.
    stream_log.append("m1", 0, "a")
    await stream_log.finish("m1", {**DONE, "seq": 1})
    await stream_log.reopen("m1")
    for seq, text in [(0, "a"), (1, "b"), (2, "c")]:
        stream_log.append("m1", seq, text)
    await stream_log.finish("m1", {**DONE, "seq": 3})

    entries = await collect(stream_log.read("m1", block_ms=1000))

    assert entries == [Chunk(0, "a"), Chunk(1, "b"), Chunk(2, "c"), Done({**DONE, "seq": 3})]
    assert [c.seq for c in await stream_log.chunks("m1", after=0)] == [1, 2]


async def test_reading_an_unknown_message_ends_after_block_ms(stream_log: StreamLog) -> None:
    assert await collect(stream_log.read("nobody", block_ms=50)) == []
    assert not await stream_log.exists("nobody")


async def test_a_reader_waits_for_a_log_that_appears_within_block_ms(
    stream_log: StreamLog, prefix: str
) -> None:
    reader = asyncio.create_task(collect(stream_log.read("m1", block_ms=10_000)))
    await reader_is_waiting(stream_log, prefix)

    stream_log.append("m1", 0, "late start")
    await stream_log.finish("m1", {**DONE, "seq": 1})

    assert await reader == [Chunk(0, "late start"), Done({**DONE, "seq": 1})]
    assert await stream_log.exists("m1")


async def test_a_finished_message_with_no_chunks_reads_as_done_only(stream_log: StreamLog) -> None:
    await stream_log.finish("m1", {"status": "failed", "seq": 0, "error": "upstream_error"})

    assert await collect(stream_log.read("m1", block_ms=1000)) == [
        Done({"status": "failed", "seq": 0, "error": "upstream_error"})
    ]


async def test_an_append_from_another_thread_is_delivered_in_order(stream_log: StreamLog) -> None:
    stream_log.append("m1", 0, "on the loop, ")

    def from_a_thread() -> None:
        stream_log.append("m1", 1, "from a thread")

    await asyncio.to_thread(from_a_thread)
    await asyncio.sleep(0)  # the hand-over to the loop is a scheduled callback
    await stream_log.finish("m1", DONE)

    entries = await collect(stream_log.read("m1", block_ms=1000))
    assert text_of(entries) == "on the loop, from a thread"


async def test_cancelling_a_blocked_read_leaves_no_task_and_no_connection(
    stream_log: StreamLog, prefix: str
) -> None:
    reader = asyncio.create_task(collect(stream_log.read("nobody", block_ms=60_000)))
    await reader_is_waiting(stream_log, prefix)

    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader

    await asyncio.sleep(0)
    assert asyncio.all_tasks() == {asyncio.current_task()}
    if isinstance(stream_log, RedisStreamLog):
        # The connection that was blocked in XREAD is closed, not left blocked on the server.
        await eventually(
            lambda: not redis_clients(f"{prefix}streamlog-reader"), "the reader connection closed"
        )


# --- Redis only ---------------------------------------------------------------------------------


class CountingStreamLog(RedisStreamLog):
    """A test seam, not a mock: pipelines still go to the real Redis; we count round trips."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips: list[int] = []  # commands per round trip

    async def _execute(self, pipe: Pipeline) -> list[Any]:
        self.round_trips.append(len(pipe.command_stack))
        return await super()._execute(pipe)


@pytest.mark.redis
async def test_appends_queued_in_the_same_tick_go_out_in_one_round_trip(prefix: str) -> None:
    log = CountingStreamLog(REDIS_URL, prefix)
    try:
        for mid in ("m1", "m2", "m3"):
            for seq in range(50):
                log.append(mid, seq, "x")
        await log.flush()
        # 150 XADDs and one EXPIRE per message, in a single pipeline.
        assert log.round_trips == [153]

        # One coalesced frame per flush: one round trip each, however many tokens it carries.
        for frame in range(5):
            log.append("m1", 50 + frame, "y")
            await log.flush()
        assert log.round_trips == [153, 2, 2, 2, 2, 2]

        # Appends queued while a round trip is in flight all go in the next one.
        log.round_trips.clear()
        log.append("m2", 50, "z")
        await asyncio.sleep(0)  # the writer takes that one entry and sends it
        for seq in range(51, 151):
            log.append("m2", seq, "z")
        await log.flush()
        assert log.round_trips == [2, 101]

        await log.finish("m2", DONE)
        entries = await collect(log.read("m2", after=49, block_ms=1000))
        assert seqs_of(entries) == list(range(50, 151))
    finally:
        await log.aclose()


@pytest.mark.redis
async def test_another_instance_on_its_own_event_loop_reads_the_same_answer(prefix: str) -> None:
    log = RedisStreamLog(REDIS_URL, prefix)

    def another_instance() -> list[Entry]:
        async def follow() -> list[Entry]:
            other = RedisStreamLog(REDIS_URL, prefix)
            try:
                return await collect(other.read("m1", block_ms=10_000))
            finally:
                await other.aclose()

        return asyncio.run(follow())

    try:
        reader = asyncio.create_task(asyncio.to_thread(another_instance))
        await readers_blocked(prefix, 1)
        for seq in range(500):
            log.append("m1", seq, f"{seq};")
            if seq % 25 == 0:
                await log.flush()
        await log.finish("m1", {**DONE, "seq": 500})

        entries = await reader
        assert seqs_of(entries) == list(range(500))
        assert entries[-1] == Done({**DONE, "seq": 500})
    finally:
        await log.aclose()


@pytest.mark.redis
async def test_every_write_sets_the_ttl_and_finish_keeps_the_log_for_ttl(prefix: str) -> None:
    log = RedisStreamLog(REDIS_URL, prefix, ttl=120)
    try:
        log.append("streaming", 0, "a")
        await log.flush()
        await log.finish("finished", {**DONE, "seq": 0})
        with redis.Redis.from_url(REDIS_URL) as client:
            # An abandoned answer (its turn died) expires too, not only a finished one.
            assert 0 < client.ttl(f"{prefix}log:streaming") <= 120
            assert 0 < client.ttl(f"{prefix}log:finished") <= 120
    finally:
        await log.aclose()


@pytest.mark.redis
async def test_hundreds_of_readers_block_at_once_and_all_get_the_answer(prefix: str) -> None:
    log = RedisStreamLog(REDIS_URL, prefix)
    try:
        readers = [
            asyncio.create_task(collect(log.read("m1", block_ms=20_000))) for _ in range(300)
        ]
        # All 300 blocked in XREAD at the same time: nobody queues behind a pool slot.
        await readers_blocked(prefix, 300)
        for seq in range(40):
            log.append("m1", seq, f"{seq}.")
        await log.finish("m1", {**DONE, "seq": 40})

        for entries in await asyncio.gather(*readers):
            assert seqs_of(entries) == list(range(40))
            assert isinstance(entries[-1], Done)
    finally:
        await log.aclose()


@pytest.mark.redis
async def test_readers_beyond_max_readers_wait_for_a_connection_instead_of_failing(
    prefix: str,
) -> None:
    log = RedisStreamLog(REDIS_URL, prefix, max_readers=2)
    try:
        readers = [asyncio.create_task(collect(log.read("m1", block_ms=10_000))) for _ in range(5)]
        await readers_blocked(prefix, 2)
        for seq in range(10):
            log.append("m1", seq, "x")
        await log.finish("m1", DONE)

        for entries in await asyncio.gather(*readers):
            assert seqs_of(entries) == list(range(10))
    finally:
        await log.aclose()


@pytest.mark.redis
async def test_append_never_raises_and_read_raises_when_redis_is_unreachable(prefix: str) -> None:
    log = RedisStreamLog(UNREACHABLE_URL, prefix, write_wait=0.2)
    errors_before = streamlog.stats.write_errors
    try:
        log.append("m1", 0, "lost to the log, kept by the DB")
        await log.finish("m1", DONE)  # gives up waiting after write_wait, does not raise
        assert streamlog.stats.write_errors > errors_before

        with pytest.raises(StreamLogUnavailable):
            await collect(log.read("m1", block_ms=100))
        with pytest.raises(StreamLogUnavailable):
            await log.exists("m1")
    finally:
        await log.aclose()


@pytest.mark.redis
async def test_the_writer_carries_on_after_redis_drops_its_connection(prefix: str) -> None:
    log = RedisStreamLog(REDIS_URL, prefix)
    try:
        for seq in range(10):
            log.append("m1", seq, f"{seq},")
        await log.flush()
        with redis.Redis.from_url(REDIS_URL) as client:
            for writer in redis_clients(f"{prefix}streamlog-writer"):
                client.client_kill_filter(_id=writer["id"])

        for seq in range(10, 20):
            log.append("m1", seq, f"{seq},")
        await log.finish("m1", DONE)

        entries = await collect(log.read("m1", block_ms=1000))
        assert seqs_of(entries) == list(range(20))
        assert isinstance(entries[-1], Done)
    finally:
        await log.aclose()


class OutageProxy:
    """A real TCP hop in front of Redis that a test can take down and bring back."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()
        self._writers.clear()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()


@pytest.mark.redis
async def test_entries_appended_while_redis_is_away_are_written_when_it_returns(
    prefix: str,
) -> None:
    proxy = OutageProxy(REDIS_URL)
    await proxy.up()
    log = RedisStreamLog(proxy.url, prefix)
    direct = RedisStreamLog(REDIS_URL, prefix)
    try:
        for seq in range(5):
            log.append("m1", seq, f"{seq},")
        await log.flush()

        await proxy.down()
        errors_before = streamlog.stats.write_errors
        for seq in range(5, 10):
            log.append("m1", seq, f"{seq},")  # Redis is away: queued, not raised
        await log.flush(timeout=0.3)
        assert streamlog.stats.write_errors > errors_before

        await proxy.up()
        await log.finish("m1", {**DONE, "seq": 10})

        entries = await collect(direct.read("m1", block_ms=10_000))
        assert seqs_of(entries) == list(range(10))
        assert entries[-1] == Done({**DONE, "seq": 10})
    finally:
        await log.aclose()
        await direct.aclose()
        await proxy.down()


# --- memory only --------------------------------------------------------------------------------


async def test_the_memory_log_forgets_an_answer_ttl_after_its_last_write() -> None:
    now = [1000.0]
    log = MemoryStreamLog(ttl=100, clock=lambda: now[0])
    log.append("finished", 0, "a")
    await log.finish("finished", DONE)
    log.append("abandoned", 0, "b")  # its turn died: no Done will ever come

    now[0] += 99
    assert await log.exists("finished")
    assert await log.exists("abandoned")

    now[0] += 2
    assert not await log.exists("finished")
    assert not await log.exists("abandoned")
    assert await collect(log.read("finished", block_ms=10)) == []


# --- one per process and loop -------------------------------------------------------------------


@pytest.mark.redis
def test_get_stream_log_gives_one_log_per_event_loop_chosen_by_redis_url(
    settings: Any, prefix: str
) -> None:
    async def twice() -> tuple[StreamLog, StreamLog]:
        return get_stream_log(), get_stream_log()

    settings.REDIS_URL = ""
    first, again = asyncio.run(twice())
    other_loop, _ = asyncio.run(twice())
    assert first is again
    assert other_loop is not first
    assert isinstance(first, MemoryStreamLog)

    settings.REDIS_URL = REDIS_URL
    settings.CHAT_REDIS_PREFIX = prefix

    async def on_redis() -> StreamLog:
        log = get_stream_log()
        try:
            log.append("m1", 0, "x")
            await log.flush()
        finally:
            await stream_logs.close()
        return log

    assert isinstance(asyncio.run(on_redis()), RedisStreamLog)
    with redis.Redis.from_url(REDIS_URL) as client:
        assert client.exists(f"{prefix}log:m1")
