"""A Redis Sentinel group of a test's own on loopback: a primary, a replica, three sentinels.

Every process runs on a free port picked at run time, in a temporary directory, and is stopped
(and its directory removed) afterwards; the machine's shared Redis is never touched. Sentinel
decides fast here (`down-after-milliseconds`, `failover-timeout` below), but nothing in the tests
depends on how fast: they wait on conditions — the sentinels agreeing on a primary, a replica in
sync — never on a clock.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import redis

from tests.servers import free_port

REDIS_SERVER = shutil.which("redis-server")
PRIMARY_NAME = "chatsite"
# How long a sentinel waits before it calls a silent primary down, and the failover's timeout.
# Small, so that the tests are short; not so small that a busy machine fails over by mistake.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
# Generous bounds on waiting for a condition: they only turn a hang into a failure.
WAIT_SECONDS = 60.0

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = WAIT_SECONDS) -> T:
    """Poll `check` until it returns something other than None/False; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        else:
            if result is not None and result is not False:
                return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error!r})")


@dataclass
class Node:
    """One redis-server process (a data server or a sentinel) on its own port."""

    name: str
    port: int
    argv: list[str]
    log: Path
    password: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(f"{self.name} to answer PING", lambda: self.client(0.2).ping())

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(
            port=self.port,
            password=self.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            protocol=2,
        )

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, as when a machine or container dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class SentinelGroup:
    """A primary, a replica of it and three sentinels watching them (quorum 2).

    With `password` the Redis servers require it (and the sentinels use it to watch them); with
    `sentinel_password` the sentinels require theirs, of their clients and of one another.
    """

    dir: Path
    password: str | None = None
    sentinel_password: str | None = None
    servers: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The REDIS_URL chatsite is given: every sentinel and the primary's name."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        login = f":{self.password}@" if self.password else ""
        return f"redis+sentinel://{login}{hosts}/{PRIMARY_NAME}/0"

    def _server(self, name: str, *extra: str) -> Node:
        assert REDIS_SERVER is not None
        port = free_port()
        workdir = self.dir / name
        workdir.mkdir()
        argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(workdir), *extra]
        if self.password:
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        return Node(name, port, argv, self.dir / f"{name}.log", self.password)

    def _sentinel(self, name: str, primary_port: int) -> Node:
        assert REDIS_SERVER is not None
        port = free_port()
        config = self.dir / f"{name}.conf"
        # A sentinel rewrites its config file as it learns the group: each has its own.
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {PRIMARY_NAME} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {PRIMARY_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {PRIMARY_NAME} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {PRIMARY_NAME} 1\n"
        )
        with config.open("a") as conf:
            if self.password:
                conf.write(f"sentinel auth-pass {PRIMARY_NAME} {self.password}\n")
            if self.sentinel_password:
                conf.write(f"requirepass {self.sentinel_password}\n")
                conf.write(f"sentinel sentinel-pass {self.sentinel_password}\n")
        argv = [REDIS_SERVER, str(config), "--sentinel"]
        return Node(name, port, argv, self.dir / f"{name}.log", self.sentinel_password)

    def start(self, sentinels: int = 3) -> None:
        primary = self._server("primary")
        primary.start()
        replica = self._server("replica", "--replicaof", "127.0.0.1", str(primary.port))
        replica.start()
        self.servers = [primary, replica]
        self.sentinels = [
            self._sentinel(f"sentinel{i}", primary.port) for i in range(1, sentinels + 1)
        ]
        for sentinel in self.sentinels:
            sentinel.start()
        wait_for("the replica to be in sync", self.replicated)
        # Each sentinel must know the replica (it is what they promote) and its two peers (the
        # quorum and the vote for a leader need them).
        for sentinel in self.sentinels:
            wait_for(f"{sentinel.name} to see the whole group", lambda s=sentinel: self.sees_all(s))

    def sees_all(self, sentinel: Node) -> bool:
        client = sentinel.client()
        try:
            state = client.sentinel_master(PRIMARY_NAME)
            replicas = client.sentinel_slaves(PRIMARY_NAME)
        finally:
            client.close()
        return int(state["num-other-sentinels"]) == len(self.sentinels) - 1 and any(
            not r["is_sdown"] and int(r["port"]) == self.servers[1].port for r in replicas
        )

    def primary_port(self) -> int | None:
        """The primary's port if all live sentinels agree on it and it answers; else None."""
        ports = set()
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            client = sentinel.client()
            try:
                address = client.sentinel_get_master_addr_by_name(PRIMARY_NAME)
            finally:
                client.close()
            if not address:
                return None
            ports.add(int(address[1]))
        if len(ports) != 1:
            return None
        (port,) = ports
        node = self.node(port)
        if not node.running:
            return None
        client = node.client()
        try:
            role = client.info("replication")["role"]
        finally:
            client.close()
        return port if role == "master" else None

    def node(self, port: int) -> Node:
        return next(node for node in self.servers if node.port == port)

    def primary(self) -> Node:
        if not self.sentinels:  # nobody promotes: the first server stays the primary
            return self.servers[0]
        return self.node(wait_for("the sentinels to agree on a primary", self.primary_port))

    def replicated(self) -> bool:
        """Whether every live replica has acknowledged all the primary has written until now.

        WAIT blocks until the replicas acknowledge this client's last write; replication is one
        ordered stream, so that covers every write made before it, by anyone.
        """
        primary = self.primary()
        replicas = sum(node.running for node in self.servers) - 1
        client = primary.client(timeout=5)
        try:
            client.set("tests:replicated", "1")
            acknowledged = int(client.execute_command("WAIT", replicas, 1000))
        finally:
            client.close()
        return replicas > 0 and acknowledged >= replicas

    def wait_for_new_primary(self, old: Node) -> Node:
        """The node the sentinels agree is the primary, once it is another than `old`."""
        port = wait_for(
            "the sentinels to promote the replica",
            lambda: port if (port := self.primary_port()) not in (None, old.port) else None,
        )
        return self.node(port)

    def stop(self) -> None:
        for node in [*self.sentinels, *self.servers]:
            node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        """Every process's log, for a failure message."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.dir.glob("*.log"))
        )


@contextlib.contextmanager
def sentinel_group(
    sentinels: int = 3, *, password: str | None = None, sentinel_password: str | None = None
) -> Iterator[SentinelGroup]:
    """A started group; stopped and removed afterwards, whatever happened."""
    group = SentinelGroup(
        Path(tempfile.mkdtemp(prefix="chatsite-sentinel-")), password, sentinel_password
    )
    try:
        group.start(sentinels)
        yield group
    finally:
        group.stop()
