"""Health probes: /healthz says the process is alive; /readyz whether it can serve, and why not."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from channels.testing import HttpCommunicator
from django.test import AsyncClient

from chat.ops import shutdown
from chat.sockets import draining as drain_state
from chatsite.asgi import application
from tests.servers import ROOT, base_env, free_port, running_chatsite
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


def test_healthz_answers_at_once_while_the_database_does_not() -> None:
    # The probes must not wait for the database: an orchestrator restarts a process whose
    # liveness probe times out. Through Django they did: every request looks up the device
    # tier's policy (a query on a cache miss), and with PostgreSQL down each query waits out
    # the pool's 10 s, so /healthz timed out for the first ~11 s and again whenever the
    # cache ran out. The site answers both probes before Django (chatsite/asgi.py). Each
    # probe here may take 5 s: under the pool's wait, far over what answering takes on a
    # loaded machine.
    port = free_port()
    dead = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port),
         "chatsite.asgi:application"],
        cwd=ROOT, env=base_env(DATABASE_URL=dead, PORT=str(port)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:  # listening: the first request starts the start-up work, on the ORM thread
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        for _ in range(5):
            alive = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            assert alive.status_code == 200
            assert alive.json()["status"] == "ok"
        # Readiness too answers within its checks' 2 s (it took over 10 s through Django).
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"]["ok"] is False  # loopback is allow-listed
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.usefixtures("closed_services")
async def test_healthz_for_a_host_the_site_does_not_serve_is_still_django_s_400(
    settings: Any,
) -> None:
    settings.ALLOWED_HOSTS = ["chat.example"]
    response = await HttpCommunicator(
        application, "GET", "/healthz", headers=[(b"host", b"evil.example")]
    ).get_response(timeout=10)
    assert response["status"] == 400
    head = await HttpCommunicator(
        application, "HEAD", "/healthz", headers=[(b"host", b"chat.example")]
    ).get_response(timeout=10)
    assert head["status"] == 200
    assert head["body"] == b""


@pytest.mark.usefixtures("closed_services")
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_a_probe_by_another_method_goes_to_django() -> None:
    """Only GET and HEAD are answered before Django: a POST gets Django's CSRF refusal, as
    every other POST without a token does."""
    response = await HttpCommunicator(
        application, "POST", "/readyz", headers=[(b"host", b"127.0.0.1")]
    ).get_response(timeout=10)
    assert response["status"] == 403
    assert b'"status"' not in response["body"]
