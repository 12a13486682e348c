"""Health probes: `/healthz` (alive), `/readyz` (DB and Redis answer; not draining)."""

from __future__ import annotations

import asyncio
import json
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


PROBES = ("/healthz", "/readyz")
_NO_CACHE = b"max-age=0, no-cache, no-store, must-revalidate, private"


def liveness() -> dict[str, str]:
    """What `/healthz` says: the process runs and its event loop answers."""
    return {"status": "ok", "instance": settings.CHAT_INSTANCE_ID}


async def readiness(address: str) -> tuple[int, dict[str, Any]]:
    """What `/readyz` says to `address`: 200 when the database (and Redis, when configured)
    answer and the instance is not draining, else 503.

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
    if not address_allowed(address, settings.CHAT_METRICS_ALLOW):
        return status, {"status": "ok" if ready else "unavailable"}
    body = {"status": "ok" if ready else "unavailable", "instance": settings.CHAT_INSTANCE_ID}
    return status, {**body, "checks": checks}


async def probe_asgi(scope: dict[str, Any], send: Any) -> None:
    """`/healthz` and `/readyz` as chatsite/asgi.py serves them: before Django.

    Through Django every request waits for the database at least once: the device tier's
    policy is looked up (a query when its cache runs out), and Django sends its
    request_started signal on a sync thread. With PostgreSQL down each query waits out the
    pool's 10 s, so the probes timed out: liveness for the first ~11 s and again whenever the
    cache ran out (an orchestrator restarts such a process), readiness for over 10 s where it
    must answer in its checks' 2 s. Here they touch the database only in readyz's own check,
    bounded, on a thread of its own.
    """
    if scope["path"] == "/healthz":
        status, body = 200, liveness()
    else:
        client = scope.get("client") or ("", 0)
        status, body = await readiness(str(client[0]))
    content = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(content)),
                (b"cache-control", _NO_CACHE),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    head = scope["method"] == "HEAD"
    await send({"type": "http.response.body", "body": b"" if head else content})


@never_cache
async def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness through Django (its tests' client); the site answers it before Django
    (`probe_asgi`). Touches nothing else."""
    return JsonResponse(liveness())


@never_cache
async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness through Django (its tests' client); the site answers it before Django
    (`probe_asgi`)."""
    status, body = await readiness(str(request.META.get("REMOTE_ADDR", "")))
    return JsonResponse(body, status=status)


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
