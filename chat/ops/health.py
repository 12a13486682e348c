"""Health probes: `/healthz` (alive), `/readyz` (DB and Redis answer; not draining)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from chat.ops.metrics_view import address_allowed
from chat.redis_clients import redis_client
from chat.sockets import draining

logger = logging.getLogger("chat.health")

# A probe must answer quickly even when a dependency hangs: a load balancer gives up first.
CHECK_TIMEOUT_SECONDS = 2.0


@never_cache
async def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process runs and its event loop answers. Touches nothing else."""
    return JsonResponse({"status": "ok", "instance": settings.CHAT_INSTANCE_ID})


@never_cache
async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when the database (and Redis, when configured) answer, else 503.

    Why it is not ready (which check failed, with the error, which names hosts, ports and
    roles) goes to the log, and to the body only for addresses in CHAT_METRICS_ALLOW (the
    load balancer, the monitoring): anyone else learns ok or unavailable.
    """
    checks: dict[str, Any] = {}
    names = ["database"]
    probes = [_timed(check_database())]
    if settings.REDIS_URL:
        names.append("redis")
        probes.append(_timed(check_redis(settings.REDIS_URL)))
    for name, result in zip(names, await asyncio.gather(*probes), strict=True):
        checks[name] = result
    if draining.draining():
        checks["shutdown"] = {"ok": False, "error": "draining: this instance is shutting down"}
    ready = all(check["ok"] for check in checks.values())
    status = 200 if ready else 503
    if not ready:
        failed = {name: check.get("error") for name, check in checks.items() if not check["ok"]}
        logger.warning("not ready: %s", failed)
    address = str(request.META.get("REMOTE_ADDR", ""))
    if not address_allowed(address, settings.CHAT_METRICS_ALLOW):
        return JsonResponse({"status": "ok" if ready else "unavailable"}, status=status)
    return JsonResponse(
        {
            "status": "ok" if ready else "unavailable",
            "instance": settings.CHAT_INSTANCE_ID,
            "checks": checks,
        },
        status=status,
    )


async def _timed(check: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            await check
    except TimeoutError:
        result: dict[str, Any] = {"ok": False, "error": f"no answer in {CHECK_TIMEOUT_SECONDS:g} s"}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    else:
        result = {"ok": True}
    result["ms"] = round((time.perf_counter() - started) * 1000, 1)
    return result


def _select_one() -> None:
    connection = connections["default"]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        # A thread of our own, not the request's: leave no connection behind in it.
        connection.close()


async def check_database() -> None:
    # Not thread-sensitive: a hung database must not block the one thread every other
    # database call of this process runs in.
    await sync_to_async(_select_one, thread_sensitive=False)()


async def check_redis(url: str) -> None:
    # A fresh connection each time: it proves Redis accepts connections now, and a probe
    # every few seconds costs nothing next to the chat's own traffic.
    client = redis_client(
        "health",
        url=url,
        socket_timeout=CHECK_TIMEOUT_SECONDS,
        connect_timeout=CHECK_TIMEOUT_SECONDS,
        retries=0,
    )
    try:
        await client.ping()
    finally:
        await client.aclose()
