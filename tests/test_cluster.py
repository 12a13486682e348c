"""`make cluster` end to end: deploy/cluster.sh started as it is, driven through nginx.

nginx in front of web1 and web2, with a PostgreSQL database of this module and a Redis server of
its own (a private `redis-server` on a free port, so stopping it to test readiness disturbs no
one else). The tests run in file order: the kill and the Redis outage come after the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.servers import ROOT, base_env, free_port, signup
from tests.test_daphne import (
    Answer,
    chat_socket,
    fresh_postgres_database,
    new_username,
    next_json,
    postgres_available,
    read_answer,
    ready,
    send_prompt,
)

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
REDIS_SERVER = shutil.which("redis-server")

pytestmark = [
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs it)"),
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed"),
    pytest.mark.timeout(180),
]

STARTUP_SECONDS = 90


@dataclass
class RedisServer:
    """A redis-server of this module's own, that a test may stop and start again."""

    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), _connect(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


def _connect(port: int) -> contextlib.AbstractContextManager[object]:
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=1)


@dataclass
class Cluster:
    base: str  # nginx
    web_ports: dict[str, int]
    run_dir: Path
    redis: RedisServer
    database_url: str

    def pid(self, instance: str) -> int:
        return int((self.run_dir / f"{instance}.pid").read_text())


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not postgres_available():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    redis_server = RedisServer(free_port())
    redis_server.start()
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-cluster-test-"))
    workdir.chmod(0o755)  # nginx's workers run as an unprivileged user and read static/ here
    ports = {"nginx": free_port(), "web1": free_port(), "web2": free_port()}
    output = (workdir / "cluster.out").open("wb")
    proc: subprocess.Popen[bytes] | None = None
    try:
        with fresh_postgres_database("chatsite_cluster") as database_url:
            env = base_env(
                CLUSTER_PORT=str(ports["nginx"]),
                WEB1_PORT=str(ports["web1"]),
                WEB2_PORT=str(ports["web2"]),
                CLUSTER_RUN_DIR=str(workdir / "run"),
                DJANGO_STATIC_ROOT=str(workdir / "static"),
                REDIS_URL=redis_server.url,
                DATABASE_URL=database_url,
                DEMO_TOKENS_PER_SECOND="200",
                CHAT_RATE_LIMIT="3/minute",
                CHAT_MAX_CONCURRENT_STREAMS="20",
                CHAT_LEASE_SECONDS="2",
                CHAT_CHECKPOINT_SECONDS="0.5",
                CHAT_SHUTDOWN_GRACE="2",
            )
            env.pop("DJANGO_SECRET_KEY")  # the script makes one for both instances
            proc = subprocess.Popen(
                ["bash", "deploy/cluster.sh"],
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: Ctrl-C here is not Ctrl-C there
            )
            base = f"http://127.0.0.1:{ports['nginx']}"
            _wait_for_cluster(base, proc, workdir / "cluster.out")
            yield Cluster(
                base,
                {"web1": ports["web1"], "web2": ports["web2"]},
                workdir / "run",
                redis_server,
                database_url,
            )
            _stop_cluster(proc)
            # Everything it started is gone: no process listens on any of its ports.
            for port in ports.values():
                with pytest.raises(OSError), _connect(port):
                    pass
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        output.close()
        redis_server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_for_cluster(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cluster.sh exited with {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the cluster did not come up:\n{log.read_text()}")


def _stop_cluster(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)  # what Ctrl-C or systemd does
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("cluster.sh did not stop within 60 s of SIGTERM") from None


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
