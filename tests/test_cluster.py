"""`make cluster` end to end: deploy/cluster.sh started as it is, driven through nginx.

nginx in front of web1 and web2, with a PostgreSQL database the script creates and a Redis server
of this module's own (a private `redis-server` on a free port, so stopping it to test readiness
disturbs no one else). The tests run in file order: the kill and the Redis outage come after the
others; then two clusters of their own are used for real and stopped — by signals to the whole
process group, and by SIGKILL of the script — and nothing of them may be left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.cluster import (
    REDIS_SERVER,
    Cluster,
    RedisServer,
    database_connections,
    drop_database,
    running_cluster,
    unused_database_url,
    wait_for_output,
    wait_until_nothing_is_left,
    what_is_left,
)
from tests.servers import ROOT, base_env, free_port, signup
from tests.test_daphne import (
    Answer,
    chat_socket,
    new_username,
    next_json,
    postgres_available,
    read_answer,
    ready,
    send_prompt,
)
from tests.test_monitoring import referenced_families

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

pytestmark = [
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs it)"),
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed"),
    pytest.mark.skipif(not postgres_available(), reason="PostgreSQL is not reachable"),
    pytest.mark.timeout(180),
]

# Small limits so that a test can reach them; a short grace so that stops are quick.
CLUSTER_ENV = {
    "DEMO_TOKENS_PER_SECOND": "200",
    "CHAT_RATE_LIMIT": "3/minute",
    "CHAT_MAX_CONCURRENT_STREAMS": "20",
    "CHAT_LEASE_SECONDS": "2",
    "CHAT_CHECKPOINT_SECONDS": "0.5",
    "CHAT_SHUTDOWN_GRACE": "2",
}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer) -> Iterator[Cluster]:
    """One cluster for the tests that use it without stopping it (they run in file order)."""
    with running_cluster(
        redis_server, unused_database_url("chatsite_cluster"), **CLUSTER_ENV
    ) as running:
        yield running
        running.proc.send_signal(signal.SIGTERM)  # what Ctrl-C or systemd does
        assert running.proc.wait(timeout=60) == 143
        assert what_is_left(running) == [], running.log()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def completed_turns(cluster: Cluster) -> float:
    key = ("chat_turns_finished_total", (("status", "complete"), ("tier", "full")))
    return sum(scrape(port).get(key, 0.0) for port in cluster.web_ports.values())


# --- the topology works -----------------------------------------------------------------------


async def test_sockets_land_on_both_instances_and_their_answers_complete(cluster: Cluster) -> None:
    client = signup(cluster.base, new_username())
    async with contextlib.AsyncExitStack() as stack:
        sockets = [
            await stack.enter_async_context(chat_socket(cluster.base, client)) for _ in range(4)
        ]
        landed = [(await ready(ws))["instance"] for ws in sockets]
        assert set(landed) == {"web1", "web2"}
        for ws in (sockets[landed.index("web1")], sockets[landed.index("web2")]):
            await send_prompt(ws, "/long 40")
            answer = await read_answer(ws)
            assert answer.done is not None and answer.done["status"] == "complete"
            assert len(answer.text.split()) == 40


def test_nginx_serves_static_files_with_long_cache_headers_and_gzip(cluster: Cluster) -> None:
    page = httpx.get(f"{cluster.base}/accounts/login/", headers={"Accept-Encoding": "gzip"})
    assert page.status_code == 200
    assert page.headers["content-encoding"] == "gzip"
    # collectstatic gave the files hashed names; the page links to those.
    css = next(part for part in page.text.split('"') if part.startswith("/static/chat/chat."))
    asset = httpx.get(f"{cluster.base}{css}", headers={"Accept-Encoding": "gzip"})
    assert asset.status_code == 200
    assert asset.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert asset.headers["content-encoding"] == "gzip"
    # No Django security headers: nginx answered from disk, daphne never saw it.
    assert "content-security-policy" not in asset.headers


def test_nginx_keeps_the_demo_model_off_the_public_side(cluster: Cluster) -> None:
    # The instances serve the demo model (it is their configured model) to themselves...
    for port in cluster.web_ports.values():
        assert httpx.get(f"http://127.0.0.1:{port}/demo/v1/models").status_code == 200
    # ...and nginx, the public side, never passes it on, however the path is spelled.
    for path in (
        "/demo/v1/models",
        "/demo/v1/chat/completions",
        "/demo/",
        "/demo/./v1/models",
        "/demo//v1/models",
        "/%64emo/v1/models",
        "/ws/../demo/v1/models",
    ):
        response = httpx.post(f"{cluster.base}{path}", json={"model": "demo-full"})
        assert response.status_code == 404, path
        assert "demo-full" not in response.text, path


async def test_metrics_counters_move_on_the_instances(cluster: Cluster) -> None:
    before = completed_turns(cluster)
    client = signup(cluster.base, new_username())
    async with chat_socket(cluster.base, client) as ws:
        await ready(ws)
        await send_prompt(ws, "/echo counted")
        answer = await read_answer(ws)
    assert answer.done is not None and answer.done["status"] == "complete"
    assert completed_turns(cluster) == before + 1
    # Through nginx too, from this machine; each answer comes from one instance.
    async with httpx.AsyncClient() as http:
        through_nginx = await http.get(f"{cluster.base}/metrics")
    assert through_nginx.status_code == 200
    assert "chat_turns_finished_total" in through_nginx.text


def test_each_instance_serves_every_metric_the_dashboard_queries(cluster: Cluster) -> None:
    wanted = referenced_families()
    for name, port in cluster.web_ports.items():
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        served = {family.name for family in text_string_to_metric_families(response.text)}
        assert wanted - served == set(), name


async def test_the_rate_limit_holds_across_both_instances(cluster: Cluster) -> None:
    client = signup(cluster.base, new_username())
    outcomes: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        sockets = [
            await stack.enter_async_context(chat_socket(cluster.base, client)) for _ in range(4)
        ]
        assert {(await ready(ws))["instance"] for ws in sockets} == {"web1", "web2"}
        for ws in sockets:
            for _ in range(3):
                await send_prompt(ws, "/echo hi")

        async def outcomes_of(ws: ClientConnection) -> None:
            for _ in range(3):
                while True:
                    frame = await next_json(ws, timeout=20)
                    if frame["type"] in ("error", "done"):
                        outcomes.append(frame.get("code") or frame["status"])
                        break

        await asyncio.gather(*(outcomes_of(ws) for ws in sockets))
    assert sorted(outcomes) == ["complete"] * 3 + ["rate_limited"] * 9


# --- failures (these change the cluster: they run last) --------------------------------------


async def test_a_tab_whose_instance_is_killed_reconnects_through_nginx_and_sees_the_outcome(
    cluster: Cluster,
) -> None:
    client = signup(cluster.base, new_username())
    async with chat_socket(cluster.base, client) as ws:
        victim = (await ready(ws))["instance"]
        await send_prompt(ws, "/long 5000")
        seen = await read_answer(ws, until_chunks=60)  # past a checkpoint (every 0.5 s)
        assert seen.done is None
        os.kill(cluster.pid(victim), signal.SIGKILL)
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 10)

    # The tab reconnects (as stream.js does) and asks for the rest of the answer.
    async with chat_socket(cluster.base, client) as ws:
        survivor = (await ready(ws))["instance"]
        assert survivor != victim
        await ws.send(json.dumps({"type": "resume", "mid": seen.mid, "after": seen.last_seq}))
        outcome = await read_answer(ws, Answer(mid=seen.mid), timeout=30)
    assert outcome.done is not None
    assert outcome.done["status"] == "failed"
    assert "interrupted" in outcome.done.get("error", "")


def test_readyz_is_503_while_redis_is_down_and_200_when_it_is_back(cluster: Cluster) -> None:
    def readyz() -> httpx.Response:
        return httpx.get(f"{cluster.base}/readyz", timeout=10)

    assert readyz().status_code == 200
    cluster.redis.stop()
    try:
        down = readyz()
        assert down.status_code == 503
        checks = down.json()["checks"]
        assert checks["redis"]["ok"] is False
        assert checks["database"]["ok"] is True
    finally:
        cluster.redis.start()
    deadline = time.monotonic() + 20
    while readyz().status_code != 200:
        assert time.monotonic() < deadline, "readyz did not recover after Redis came back"
        time.sleep(0.2)


def test_the_shipped_nginx_config_is_valid_as_it_is(tmp_path: Path) -> None:
    # Verbatim but for the pid file and logs (which need /run and /var/log/nginx).
    shipped = (ROOT / "deploy" / "nginx.conf").read_text()
    config = (
        shipped.replace("/run/nginx-chatsite.pid", f"{tmp_path}/nginx.pid")
        .replace("/var/log/nginx/chatsite.", f"{tmp_path}/")
        .replace("http {", f"http {{\n    client_body_temp_path {tmp_path}/body;", 1)
        .replace("http {", f"http {{\n    proxy_temp_path {tmp_path}/proxy;", 1)
    )
    (tmp_path / "nginx.conf").write_text(config)
    assert NGINX is not None
    checked = subprocess.run(
        [NGINX, "-t", "-p", f"{tmp_path}/", "-c", str(tmp_path / "nginx.conf")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


# --- stopping a used cluster leaves nothing behind (issue 19) --------------------------------
#
# Each stop test starts a cluster of its own (a stop ends it), uses it for real — tabs through
# nginx on both instances, a dropped answer resumed on the other instance, answers streaming at
# the moment of the stop — and then looks for anything of it by process group and session, by
# port and by database session.

STOP_TEST_ENV = {**CLUSTER_ENV, "CHAT_RATE_LIMIT": "100/minute"}


async def resume_on_the_other_instance(cluster: Cluster, client: httpx.Client) -> None:
    """A tab drops mid-answer and resumes it on the other instance, as stream.js does."""
    async with chat_socket(cluster.base, client) as ws:
        first = (await ready(ws))["instance"]
        await send_prompt(ws, "/long 400")
        before = await read_answer(ws, until_chunks=3)
        assert before.done is None, "the answer must still be streaming when the tab drops"
        ws.transport.abort()  # the network goes away: no closing handshake
    for _ in range(10):  # nginx picks the instance; a tab keeps reconnecting until elsewhere
        async with chat_socket(cluster.base, client) as ws:
            if (await ready(ws))["instance"] == first:
                continue
            await ws.send(
                json.dumps({"type": "resume", "mid": before.mid, "after": before.last_seq})
            )
            resumed = await read_answer(ws, Answer(mid=before.mid), timeout=30)
            assert resumed.done is not None and resumed.done["status"] == "complete"
            return
    raise AssertionError(f"ten sockets in a row landed on {first}")


async def tabs_streaming(
    stack: contextlib.AsyncExitStack, cluster: Cluster, count: int = 6
) -> list[ClientConnection]:
    """Tabs through nginx on both instances, each in the middle of a long answer."""
    client = signup(cluster.base, new_username())
    await resume_on_the_other_instance(cluster, client)
    tabs = [
        await stack.enter_async_context(chat_socket(cluster.base, client)) for _ in range(count)
    ]
    assert {(await ready(ws))["instance"] for ws in tabs} == {"web1", "web2"}
    for ws in tabs:
        await send_prompt(ws, "/long 5000")  # 25 s at 200 tokens/s: far longer than the grace
    for ws in tabs:
        assert (await read_answer(ws, until_chunks=2)).done is None
    return tabs


async def how_it_ended(ws: ClientConnection) -> tuple[str | None, int | str]:
    """The status of the `done` the tab got (if any) and its close code ("open": none in 40 s)."""
    status = None
    try:
        while True:
            raw = await asyncio.wait_for(ws.recv(), 40)
            if isinstance(raw, str) and raw.startswith("{"):
                frame = json.loads(raw)
                if frame["type"] == "done":
                    status = frame["status"]
    except TimeoutError:
        return status, "open"
    except ConnectionClosed as closed:
        return status, closed.rcvd.code if closed.rcvd is not None else "no close frame"


async def test_a_used_cluster_stopped_by_sigterm_to_its_group_leaves_nothing_behind(
    redis_server: RedisServer,
) -> None:
    database_url = unused_database_url("chatsite_cluster_stop")
    with running_cluster(redis_server, database_url, **STOP_TEST_ENV) as cluster:
        async with contextlib.AsyncExitStack() as stack:
            tabs = await tabs_streaming(stack, cluster)
            os.killpg(cluster.proc.pid, signal.SIGTERM)  # as a supervisor stops its group
            await asyncio.to_thread(wait_for_output, cluster, "[cluster] stopping")
            # More signals while it stops — make passes its SIGTERM on to the script, people
            # press Ctrl-C twice, supervisors repeat themselves. A signal during the stop used
            # to end the script before it had stopped its children.
            for again in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                os.killpg(cluster.proc.pid, again)
            *endings, status = await asyncio.gather(
                *(how_it_ended(ws) for ws in tabs), asyncio.to_thread(cluster.proc.wait, 90)
            )
        # The script exits only when everything it started is gone: no waiting here.
        assert what_is_left(cluster) == [], cluster.log()
        assert status == 143  # the first signal's status (128 + 15); the others changed nothing
        # And the stop was the graceful one: each tab got its answer's end (cut at the grace,
        # kept as `failed`) and the close that tells it to come back (4503).
        assert endings == [("failed", 4503)] * len(tabs), cluster.log()


async def test_a_used_cluster_whose_script_is_killed_leaves_nothing_behind(
    redis_server: RedisServer,
) -> None:
    # A libpq URL without a host (libpq's defaults, here from PGHOST and PGUSER): the script
    # creates the database and the instances use it (issue 16).
    database_url = unused_database_url("chatsite_cluster_kill").replace(
        "postgres://postgres@127.0.0.1:5432/", "postgres:///"
    )
    with running_cluster(
        redis_server, database_url, PGHOST="127.0.0.1", PGUSER="postgres", **STOP_TEST_ENV
    ) as cluster:
        async with contextlib.AsyncExitStack() as stack:
            tabs = await tabs_streaming(stack, cluster)
            cluster.proc.kill()  # SIGKILL to the script alone: it cannot stop anything itself
            assert cluster.proc.wait(timeout=10) == -signal.SIGKILL
            # The kernel stops the children for it (they run with a parent-death signal).
            left = await asyncio.to_thread(wait_until_nothing_is_left, cluster, 30)
            assert left == [], cluster.log()
            endings = await asyncio.gather(*(how_it_ended(ws) for ws in tabs))
        # The tabs lost their connection: nothing was left to end their answers or say goodbye.
        assert endings == [(None, "no close frame")] * len(tabs)


def test_the_database_check_creates_the_database_of_a_url_without_a_host() -> None:
    name = unused_database_url("chatsite_check").rsplit("/", 1)[1]
    env = base_env(DATABASE_URL=f"postgres:///{name}", PGHOST="127.0.0.1", PGUSER="postgres")

    def check() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "deploy/cluster_checks.py", "database"]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)

    try:
        first = check()
        assert first.returncode == 0, first.stderr
        assert f"created database {name}" in first.stderr
        assert database_connections(f"postgres:///{name}") == 0  # it exists, nobody is on it
        again = check()  # the next start finds it
        assert again.returncode == 0, again.stderr
        assert "created" not in again.stderr
    finally:
        drop_database(f"postgres:///{name}")


def test_the_database_check_says_what_it_cannot_reach_without_the_password() -> None:
    url = f"postgres://chat:pass-w0rd-secret@127.0.0.1:{free_port()}/chatsite"
    command = [sys.executable, "deploy/cluster_checks.py", "database"]
    run = subprocess.run(
        command, cwd=ROOT, env=base_env(DATABASE_URL=url), capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "cannot reach or create the database 'chatsite' on 127.0.0.1" in run.stderr
    assert "pass-w0rd-secret" not in run.stderr
