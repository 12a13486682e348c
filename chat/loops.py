"""Services that belong to one event loop (Redis and HTTP clients, the stream log, the control
channel, the limiter), and stopping background tasks for sure."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# Strong references to the tasks closing replaced services: the loop keeps only weak ones.
_closing: set[asyncio.Task[None]] = set()


class PerLoop(Generic[T]):
    """One instance of a service per running event loop, built from settings on first use.

    redis-py's and httpx's asyncio connections belong to the loop that opened them: production
    runs one loop, the tests run many. `config` reads the settings the service is built from;
    when it changes (tests override settings), the next `get()` builds a new instance and
    closes the old one in the background.
    """

    def __init__(
        self,
        name: str,
        build: Callable[[], T],
        close: Callable[[T], Awaitable[None]],
        *,
        config: Callable[[], Hashable] = lambda: None,
    ) -> None:
        self.name = name
        self._build = build
        self._close = close
        self._config = config
        self._entries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Hashable, T]]
        self._entries = weakref.WeakKeyDictionary()
        # get() may run in several threads' loops at once (tests start servers in threads).
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<PerLoop {self.name}: {len(self._entries)} loops>"

    def get(self) -> T:
        """This loop's instance, built now if there is none (or the settings changed)."""
        loop = asyncio.get_running_loop()
        config = self._config()
        with self._lock:
            entry = self._entries.get(loop)
            if entry is not None and entry[0] == config:
                return entry[1]
            service = self._build()
            self._entries[loop] = (config, service)
        if entry is not None:
            task = loop.create_task(self._close_quietly(entry[1]), name=f"close old {self.name}")
            _closing.add(task)
            task.add_done_callback(_closing.discard)
        return service

    def peek(self) -> T | None:
        """This loop's instance if one was built (never builds one)."""
        entry = self._entries.get(asyncio.get_running_loop())
        return entry[1] if entry is not None else None

    async def close(self) -> None:
        """Close and forget this loop's instance (shutdown, test teardown)."""
        with self._lock:
            entry = self._entries.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await self._close(entry[1])

    def forget_all(self) -> None:
        """Forget every loop's instance without closing it (settings changed under the tests)."""
        with self._lock:
            self._entries.clear()

    async def _close_quietly(self, service: T) -> None:
        try:
            await self._close(service)
        except Exception:
            log.exception("could not close a replaced %s", self.name)


async def cancel_and_wait(task: asyncio.Task[Any], timeout: float = 5.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling again if the first was lost.

    A task cancelled while redis-py runs a command under its own `asyncio.timeout` can see the
    cancellation turned into a `TimeoutError` (and the cancel request withdrawn), which an
    outage-retry loop then swallows: one `cancel()` is not always the end of such a task, and a
    shutdown (or a test's loop teardown) would wait for it forever.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
