"""A real TCP hop in front of the demo model that can hold streamed answers mid-way.

Armed, it forwards each response until it has carried `after_events` server-sent events, then
holds the rest until the test releases it: an answer is then in flight for exactly as long as the
test needs, however fast or slow the machine is. It never alters, reorders or drops a byte. It runs
its own event loop in a thread, so the test's loop (or none) does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

EVENT_END = b"\n\n"


@dataclass
class _Exchange:
    """One client connection: how many events its current response has carried."""

    events: int = 0


class HeldAnswers:
    def __init__(self, upstream: str, after_events: int) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.path = parts.path
        self.after_events = after_events
        self.port = 0
        self.held = 0  # responses held right now
        self._armed = False
        self._loop = asyncio.new_event_loop()
        self._released = asyncio.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="held-answers", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        """The base URL to give chatsite as LLM_BASE_URL."""
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)
        assert self.port, "the proxy did not start"

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def arm(self) -> None:
        """Hold every response that reaches `after_events` events from now on."""
        self._loop.call_soon_threadsafe(self._arm)

    def release(self) -> None:
        """Let every held response go on, and hold no more."""
        self._loop.call_soon_threadsafe(self._release)

    def wait_held(self, count: int, timeout: float = 60.0) -> None:
        """Wait until `count` responses are held (a condition, polled)."""
        deadline = time.monotonic() + timeout
        while self.held < count:
            assert time.monotonic() < deadline, f"{self.held} of {count} answers held"
            time.sleep(0.01)

    def _arm(self) -> None:
        self._armed = True
        self._released.clear()

    def _release(self) -> None:
        self._armed = False
        self._released.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connect, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()
        # Stopped: end the connections still open here, on this loop, before it closes. Left
        # pending, their coroutines were finalised later by the collector, in whatever test
        # ran then, writing to a closed loop (and, under CPython 3.11, breaking an `ast.parse`
        # that test was in: tests/test_house.py).
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        exchange = _Exchange()
        # Cancelled only when the proxy stops (`_run`): end quietly, as asyncio's server
        # callback asks a cancelled connection task for its exception and logs that.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(
                self._requests(reader, up_writer, exchange),
                self._responses(up_reader, writer, exchange),
                return_exceptions=True,
            )

    @staticmethod
    async def _requests(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, exchange: _Exchange
    ) -> None:
        try:
            while data := await source.read(65536):
                exchange.events = 0  # a new request on this (kept-alive) connection
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    async def _responses(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, exchange: _Exchange
    ) -> None:
        try:
            while data := await source.read(65536):
                cut = self._cut(data, exchange) if self._armed else None
                if cut is not None:
                    sink.write(data[:cut])
                    await sink.drain()
                    self.held += 1
                    try:
                        await self._released.wait()
                    finally:
                        self.held -= 1
                    data = data[cut:]
                sink.write(data)
                await sink.drain()
        finally:
            with contextlib.suppress(OSError):
                sink.close()

    def _cut(self, data: bytes, exchange: _Exchange) -> int | None:
        """Where in `data` the response reaches `after_events` events, if it does."""
        position = 0
        while (found := data.find(EVENT_END, position)) != -1:
            position = found + len(EVENT_END)
            exchange.events += 1
            if exchange.events == self.after_events:
                return position
        return None


@contextlib.contextmanager
def held_answers(upstream: str, after_events: int) -> Iterator[HeldAnswers]:
    proxy = HeldAnswers(upstream, after_events)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
