"""Message ids `<unix-ms>-<instance>-<shard>`: unique and monotonic per instance."""

from __future__ import annotations

import threading
import time

from django.conf import settings


class MessageIdClock:
    """A hybrid logical clock: wall-clock milliseconds, bumped by one when it would not advance.

    Two turns in the same millisecond, or a wall clock that steps backwards, still get strictly
    increasing timestamps, so ids stay unique and sortable per instance (the seed post's
    `timestamp-instance-shard` collided within one second).
    """

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._last = 0
        self._lock = threading.Lock()  # turns start on the event loop and in worker threads

    def tick(self) -> int:
        now = time.time_ns() // 1_000_000
        with self._lock:
            self._last = now if now > self._last else self._last + 1
            return self._last

    def new_id(self, shard: str) -> str:
        return f"{self.tick()}-{self.instance}-{shard}"


_clock: MessageIdClock | None = None


def new_message_id(shard: str) -> str:
    global _clock
    if _clock is None or _clock.instance != settings.CHAT_INSTANCE_ID:
        _clock = MessageIdClock(settings.CHAT_INSTANCE_ID)
    return _clock.new_id(shard)


def parse_message_id(mid: str) -> tuple[int, str, str] | None:
    """Split an id into (unix-ms, instance, shard), or None when it is not one of ours."""
    head, sep, rest = mid.partition("-")
    instance, sep2, shard = rest.rpartition("-")
    if not (sep and sep2 and head.isdigit() and instance and shard.isdigit()):
        return None
    return int(head), instance, shard
