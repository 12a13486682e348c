"""`make cluster` under test: deploy/cluster.sh started as a supervisor starts it, and its remains.

A cluster runs in a session of its own (as under a supervisor or a CI harness), on free ports,
with a Redis server of the test module's own and a PostgreSQL database of its own. What it left
behind after a stop is found by process group and session (the script's own, and those of the
daphne instances and nginx, whose ids are in the run directory's pid files), never by the names
of other people's processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

from tests.servers import ROOT, base_env, free_port

REDIS_SERVER = shutil.which("redis-server")
POSTGRES_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
STARTUP_SECONDS = 90


@dataclass
class RedisServer:
    """A redis-server of a test module's own, that a test may stop and start again."""

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
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@dataclass
class Cluster:
    """A running deploy/cluster.sh: nginx's base URL, the instances' ports, the script."""

    base: str  # nginx
    ports: dict[str, int]  # nginx, web1, web2
    run_dir: Path
    output: Path  # everything the script and its children printed
    proc: subprocess.Popen[bytes]
    redis: RedisServer
    database_url: str
    groups: set[int] = field(default_factory=set)  # filled once it is up

    @property
    def web_ports(self) -> dict[str, int]:
        return {name: port for name, port in self.ports.items() if name != "nginx"}

    def pid(self, name: str) -> int:
        """The pid of web1, web2 or nginx (its master), from the run directory."""
        return int((self.run_dir / f"{name}.pid").read_text())

    def log(self) -> str:
        return self.output.read_text(errors="replace")


def process_table() -> dict[int, tuple[str, int, int, str]]:
    """pid → (state, process group, session, command line) of every process on the machine."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue  # ended while we looked
        # The command name (in parentheses) may hold spaces; the fields after it do not.
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (fields[0], int(fields[2]), int(fields[3]), command)
    return table


def leftovers(groups: set[int]) -> list[str]:
    """Live processes in any of these process groups or sessions.

    A zombie does not count: it holds no port, no file and no connection, only its exit status
    until its parent (or init, for an orphan) reaps it.
    """
    return [
        f"{pid} (state {state}, group {group}, session {session}): {command}"
        for pid, (state, group, session, command) in process_table().items()
        if (group in groups or session in groups) and state != "Z"
    ]


def port_is_free(port: int) -> bool:
    """Could the next cluster listen here? (Bound as nginx and daphne bind: SO_REUSEADDR.)"""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def database_connections(database_url: str) -> int:
    """Sessions connected to the cluster's database (what makes DROP DATABASE fail)."""
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def what_is_left(cluster: Cluster) -> list[str]:
    """Everything of the cluster still there: processes, ports in use, database sessions."""
    left = leftovers(cluster.groups)
    left += [
        f"port {port} ({name}) still in use"
        for name, port in cluster.ports.items()
        if not port_is_free(port)
    ]
    sessions = database_connections(cluster.database_url)
    if sessions:
        left.append(f"{sessions} sessions still on the database")
    return left


def wait_until_nothing_is_left(cluster: Cluster, timeout: float) -> list[str]:
    """Poll until nothing of the cluster is left; what is still there when time runs out."""
    deadline = time.monotonic() + timeout
    while left := what_is_left(cluster):
        if time.monotonic() > deadline:
            return left
        time.sleep(0.1)
    return []


def wait_for_output(cluster: Cluster, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in cluster.log():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared in the output:\n{cluster.log()}")
        time.sleep(0.05)


def unused_database_url(prefix: str) -> str:
    return f"postgres://postgres@127.0.0.1:5432/{prefix}_{uuid.uuid4().hex[:10]}"


def drop_database(database_url: str) -> None:
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextlib.contextmanager
def running_cluster(redis: RedisServer, database_url: str, **env: str) -> Iterator[Cluster]:
    """deploy/cluster.sh in a session of its own, up and answering; whatever is left killed after.

    The caller stops it (that is what the tests are about); afterwards anything of it still
    there is killed by process group, so that a failed test leaves nothing running either.
    """
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-cluster-test-"))
    workdir.chmod(0o755)  # nginx's workers run as an unprivileged user and read static/ here
    ports = {"nginx": free_port(), "web1": free_port(), "web2": free_port()}
    environment = base_env(
        CLUSTER_PORT=str(ports["nginx"]),
        WEB1_PORT=str(ports["web1"]),
        WEB2_PORT=str(ports["web2"]),
        CLUSTER_RUN_DIR=str(workdir / "run"),
        DJANGO_STATIC_ROOT=str(workdir / "static"),
        REDIS_URL=redis.url,
        DATABASE_URL=database_url,
        **env,
    )
    environment.pop("DJANGO_SECRET_KEY")  # the script makes one for both instances
    output = workdir / "cluster.out"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            ["bash", "deploy/cluster.sh"],
            cwd=ROOT,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group and session of its own, as a supervisor does
        )
    cluster = Cluster(
        f"http://127.0.0.1:{ports['nginx']}",
        ports,
        workdir / "run",
        output,
        proc,
        redis,
        database_url,
        {proc.pid},
    )
    try:
        _wait_until_up(cluster)
        cluster.groups |= {cluster.pid(name) for name in ("web1", "web2", "nginx")}
        yield cluster
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for group in cluster.groups:
            if leftovers({group}):  # only what is still ours: a test failed
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        drop_database(database_url)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until_up(cluster: Cluster) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if cluster.proc.poll() is not None:
            raise RuntimeError(
                f"cluster.sh exited with {cluster.proc.returncode}:\n{cluster.log()}"
            )
        with contextlib.suppress(httpx.TransportError):
            up = httpx.get(f"{cluster.base}/healthz", timeout=1).status_code == 200
            if up and (cluster.run_dir / "nginx.pid").exists():
                return
        time.sleep(0.2)
    raise RuntimeError(f"the cluster did not come up:\n{cluster.log()}")
