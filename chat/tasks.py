"""Stopping this process's background tasks (stream-log writer, control subscriber) for sure."""

from __future__ import annotations

import asyncio
from typing import Any


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
