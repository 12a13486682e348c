"""Health probes: /healthz says the process is alive; /readyz whether it can serve, and why not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import AsyncClient

from chat.ops import shutdown
from chat.sockets import draining as drain_state
from tests.servers import free_port, running_chatsite
from tests.test_daphne import daphne_instance

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def draining() -> Iterator[None]:
    yield
    drain_state.reset()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_healthz_answers_ok_with_the_instance(settings: Any) -> None:
    settings.CHAT_INSTANCE_ID = "web7"
    response = await AsyncClient().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "instance": "web7"}
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_readyz_is_ready_when_the_database_answers_and_no_redis_is_configured(
    settings: Any,
) -> None:
    settings.REDIS_URL = ""
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True
    assert "redis" not in body["checks"]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_readyz_checks_redis_when_it_is_configured(settings: Any) -> None:
    settings.REDIS_URL = REDIS_URL
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["redis"]["ok"] is True


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_readyz_is_503_and_names_redis_when_redis_is_unreachable(settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is False
    assert "Connect" in body["checks"]["redis"]["error"]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_readyz_is_503_while_the_instance_drains(settings: Any, draining: None) -> None:
    settings.REDIS_URL = ""
    await shutdown.drain(0, stop_listening=False)
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["shutdown"] == {
        "ok": False,
        "error": "draining: this instance is shutting down",
    }


def test_with_the_database_down_healthz_still_answers_and_readyz_names_the_database() -> None:
    # A real server whose DATABASE_URL points where no PostgreSQL listens.
    dead = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    with running_chatsite(database_url=dead) as base:
        alive = httpx.get(f"{base}/healthz", timeout=10)
        ready = httpx.get(f"{base}/readyz", timeout=10)
    assert alive.status_code == 200
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"]["ok"] is False
    # Without a pool the connect fails at once (OperationalError); with psycopg's pool (the
    # default for PostgreSQL) the probe gives up after its own short timeout.
    error = ready.json()["checks"]["database"]["error"]
    assert "OperationalError" in error or "no answer" in error


def test_readyz_tells_a_stranger_only_unavailable_and_logs_why() -> None:
    # The review read the database's host, port and role, and Redis's address, off /readyz.
    # Here nothing listens at either, and this client (127.0.0.1) is not on the allow-list.
    db_port, redis_port = free_port(), free_port()
    dead_db = f"postgres://chatsite_role@127.0.0.1:{db_port}/secretdb"
    # Without the pool (DATABASE_POOL=0) the dead database fails at once: the pool's wait is
    # the test above's, and here it only made the server slow to start and to stop (~20 s).
    with daphne_instance(
        "web1",
        database_url=dead_db,
        REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        CHAT_METRICS_ALLOW="10.99.0.0/16",
        DATABASE_POOL="0",
    ) as server:
        ready = httpx.get(f"{server.base}/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json() == {"status": "unavailable"}
        for secret in (str(db_port), str(redis_port), "chatsite_role", "secretdb", "127.0.0.1"):
            assert secret not in ready.text
        # The operator still learns why, from the log.
        deadline = time.monotonic() + 10
        while "not ready" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        line = next(line for line in server.log().splitlines() if "not ready" in line)
        assert "database" in line and "redis" in line, line


def test_readyz_gives_the_allow_listed_every_check_and_why() -> None:
    dead_db = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    with running_chatsite(
        database_url=dead_db, CHAT_METRICS_ALLOW="127.0.0.1", DATABASE_POOL="0"
    ) as base:  # no pool: see the test above
        ready = httpx.get(f"{base}/readyz", timeout=10)
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"]["ok"] is False
