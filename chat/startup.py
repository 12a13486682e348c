"""Process start-up work (warm the upstream pool, mark our orphaned answers) and the HTTP entry."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from chat import services
from chat.upstream import get_client

log = logging.getLogger(__name__)

ASGIApp = Any

_started_loops: set[int] = set()
_background: set[asyncio.Task[None]] = set()  # strong references: the loop keeps weak ones


def ensure_started() -> None:
    """Run the start-up work once per event loop, in the background, on the first request.

    daphne has no lifespan events, so the first HTTP request or socket is the earliest hook.
    """
    loop = asyncio.get_running_loop()
    if id(loop) in _started_loops:
        return
    _started_loops.add(id(loop))
    task = loop.create_task(_start_up())
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _start_up() -> None:
    try:
        # Answers this instance owned before a restart cannot still be running.
        reaped = await database_sync_to_async(services.do_reap_orphans)(
            instance=settings.CHAT_INSTANCE_ID
        )
        if reaped:
            log.warning("marked %d interrupted answers as failed", reaped)
    except Exception:
        log.exception("could not mark interrupted answers")
    # Open the pooled connection now so no chat turn pays for DNS, TCP and TLS.
    await get_client().warm()


class HttpEntry:
    """HTTP: the demo model under /demo/v1/ (no Django on its path), everything else Django."""

    def __init__(self, django_app: ASGIApp, *, demo: ASGIApp) -> None:
        self.django_app = django_app
        self.demo = demo

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"].startswith("/demo/v1/"):
            await self.demo(scope, receive, send)
            return
        ensure_started()
        await self.django_app(scope, receive, send)


async def close_services(timeout: float = 10.0) -> None:
    """Close this loop's Redis and HTTP clients and their background tasks (shutdown, tests).

    The stream log writes what it still has queued first. Each close is bounded: a shutdown
    must finish even when Redis does not answer.
    """
    from chat.control import close_control
    from chat.ratelimit import close_limiter
    from chat.streamlog import close_stream_log
    from chat.upstream import close_client

    for close in (close_stream_log, close_control, close_client, close_limiter):
        try:
            await asyncio.wait_for(close(), timeout)
        except Exception:
            log.exception("could not close %s cleanly", close.__name__)
