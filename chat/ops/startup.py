"""Process start-up work, once per event loop: mark interrupted answers, warm the upstream
pool, start the periodic reaper; and closing the loop's services at the end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref

from django.conf import settings

from chat.limits.limiter import limiters
from chat.limits.sockets import socket_counters
from chat.turns import reaper
from chat.turns.control import controls
from chat.turns.model_client import model_clients
from chat.turns.streamlog import stream_logs

log = logging.getLogger(__name__)

_started_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_background: set[asyncio.Task[None]] = set()  # strong references: the loop keeps weak ones


def ensure_started() -> None:
    """Run the start-up work once per event loop, in the background, on the first request.

    daphne has no lifespan events, so the first HTTP request or socket is the earliest hook.
    """
    loop = asyncio.get_running_loop()
    if loop in _started_loops:
        return
    _started_loops.add(loop)
    for job in (_start_up(), _reap_periodically()):
        task = loop.create_task(job)
        _background.add(task)
        task.add_done_callback(_background.discard)


async def _start_up() -> None:
    try:
        # Answers this instance owned before a restart cannot still be running.
        reaped = await reaper.reap(instance=settings.CHAT_INSTANCE_ID)
        # And those of instances that died and whose lease ran out meanwhile: an instance
        # that takes over from a dead one marks them now, not a lease after its start.
        reaped += await reaper.reap()
        if reaped:
            log.warning("marked %d interrupted answers as failed", reaped)
    except Exception:
        log.exception("could not mark interrupted answers")
    # Open the pooled connection now so no chat turn pays for DNS, TCP and TLS.
    await model_clients.get().warm()


async def _reap_periodically() -> None:
    """Mark answers whose instance died (their lease ran out): one job per process.

    A tab following such an answer sees it end at the next round; nothing else polls for it.
    """
    while True:
        await asyncio.sleep(settings.CHAT_LEASE_SECONDS)
        try:
            await reaper.reap()
        except Exception:
            log.exception("could not reap interrupted answers")


async def close_services(timeout: float = 10.0) -> None:
    """Close this loop's Redis and HTTP clients and their background tasks (shutdown, tests).

    The stream log writes what it still has queued first. Each close is bounded: a shutdown
    must finish even when Redis does not answer.
    """
    loop = asyncio.get_running_loop()
    _started_loops.discard(loop)  # a later request on this loop starts it all again
    for task in [t for t in _background if t.get_loop() is loop]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    for service in (stream_logs, controls, model_clients, limiters, socket_counters):
        try:
            await asyncio.wait_for(service.close(), timeout)
        except Exception:
            log.exception("could not close the %s cleanly", service.name)
