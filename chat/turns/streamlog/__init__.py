"""The stream log of this process: Redis Streams when REDIS_URL is set, else memory; one per loop.

The parts: base.py (entries and the interface), memory.py, redis_streams.py.
"""

from __future__ import annotations

from collections.abc import Hashable

from django.conf import settings

from chat.loops import PerLoop
from chat.turns.streamlog.base import Chunk, Done, Entry, StreamLog, StreamLogUnavailable, stats
from chat.turns.streamlog.memory import MemoryStreamLog
from chat.turns.streamlog.redis_streams import RedisStreamLog

__all__ = [
    "Chunk",
    "Done",
    "Entry",
    "MemoryStreamLog",
    "RedisStreamLog",
    "StreamLog",
    "StreamLogUnavailable",
    "get_stream_log",
    "stats",
    "stream_logs",
]


def _config() -> Hashable:
    return (settings.REDIS_URL, settings.CHAT_REDIS_PREFIX, settings.CHAT_STREAM_LOG_TTL)


def _build() -> StreamLog:
    if settings.REDIS_URL:
        return RedisStreamLog(
            settings.REDIS_URL,
            settings.CHAT_REDIS_PREFIX,
            settings.CHAT_STREAM_LOG_TTL,
            max_readers=settings.CHAT_STREAM_LOG_MAX_READERS,
        )
    return MemoryStreamLog(settings.CHAT_STREAM_LOG_TTL)


async def _close(log: StreamLog) -> None:
    await log.aclose()


stream_logs: PerLoop[StreamLog] = PerLoop("stream log", _build, _close, config=_config)


def get_stream_log() -> StreamLog:
    """This process's stream log for the running event loop."""
    return stream_logs.get()
