"""The processes a benchmark starts and watches: demo model, chatsite, naive relay; /proc readings.

Every server runs as a real subprocess on 127.0.0.1, started the way a developer would start
it, and is stopped by the `with` block that started it. CPU time and memory are read from
/proc (psutil is not installed, and /proc is all it would read anyway).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from tests.demo_server import demo_process
from tests.servers import base_env

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DAPHNE = str(Path(sys.executable).parent / "daphne")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
STARTUP_SECONDS = 40.0
PASSWORD = "a-long-bench-passphrase-42"

# A user that never meets a limit: the benchmark measures the relay, not the limiter (which
# still runs on every prompt: its cost is part of what is measured).
UNLIMITED = {
    "CHAT_RATE_LIMIT": "100000/minute",
    "CHAT_MAX_CONCURRENT_STREAMS": "1000",
    "CHAT_DAILY_TOKENS": "0",
    "CHAT_HTTP_RATE_LIMIT": "100000/minute",
    # Every simulated user connects from 127.0.0.1: no cap on sockets per address.
    "CHAT_MAX_SOCKETS_PER_ADDRESS": "0",
    # Reconnecting clients (a failed turn reconnects) are measured, not refused.
    "CHAT_SOCKET_RATE": "100000/minute",
    # Pages are loaded by the harness, not measured against a limit.
    "CHAT_PAGE_RATE": "100000/minute",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A started server: its process, where it listens, and its CPU and memory readings."""

    name: str
    popen: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:PORT (the demo's includes /v1)
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (all its threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # After the ")" of the command name: field 3 is the state, so utime/stime (fields 14
        # and 15 of stat(5)) are at index 11 and 12.
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_bytes(self) -> int:
        return self._status_kib("VmRSS:") * 1024

    def rss_peak_bytes(self) -> int:
        """The most resident memory the process has had since it started (its high-water mark)."""
        return self._status_kib("VmHWM:") * 1024

    def _status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
        return 0

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


@dataclass
class ProcGroup:
    """Several server processes measured as one (their CPU and memory summed)."""

    name: str
    procs: list[Proc]

    @property
    def base(self) -> str:
        return self.procs[0].base

    @property
    def bases(self) -> list[str]:
        return [p.base for p in self.procs]

    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds() for p in self.procs)

    def rss_bytes(self) -> int:
        return sum(p.rss_bytes() for p in self.procs)

    def rss_peak_bytes(self) -> int:
        return sum(p.rss_peak_bytes() for p in self.procs)

    def log_tail(self, chars: int = 2000) -> str:
        return "\n".join(p.log_tail(chars // len(self.procs)) for p in self.procs)


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def own_cpu_seconds() -> float:
    """CPU time of this (the client's) process."""
    times = os.times()
    return times.user + times.system


def stop(popen: subprocess.Popen[bytes]) -> None:
    """Terminate a server we started, then kill it if it has not exited in 10 s."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def wait_for_port(
    port: int, popen: subprocess.Popen[bytes], log: Path | None, seconds: float = STARTUP_SECONDS
) -> None:
    """Wait until the port accepts TCP; no HTTP request, so the app stays cold."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log else ""
            raise RuntimeError(f"server exited with {popen.returncode}:\n{tail}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port} after {seconds:g} s")


@contextlib.contextmanager
def demo_model(ttfb_ms: int, tps: float, *, stats: bool = False) -> Iterator[Proc]:
    """The standalone demo model (`python -m chat.demo_upstream`); base is its /v1 URL.

    `stats=True` starts tests/demo_server.py instead: the same model plus a test-only
    `/_test/stats` window listing the client port of every request it saw.
    """
    with demo_process(ttfb_ms, tps, stats=stats) as (popen, base):
        yield Proc("demo", popen, base)


def demo_requests(demo: Proc) -> list[tuple[str, int]]:
    """(path, client port) of every request a `stats=True` demo model has seen."""
    origin = demo.base.rsplit("/", 1)[0]
    response = httpx.get(origin + "/_test/stats", timeout=10, trust_env=False)
    response.raise_for_status()
    return [(path, int(port)) for path, port in response.json()["requests"]]


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a production-like chatsite (DEBUG off) for benchmarks: the tests'
    server environment, quieter, with the limits lifted."""
    return base_env(DJANGO_LOG_LEVEL="WARNING", **{**UNLIMITED, **extra})


def server_setting(name: str) -> str:
    """A chatsite setting as a benchmark server sees it (its default or our environment)."""
    done = subprocess.run(
        [PYTHON, "-c", f"from django.conf import settings; print(settings.{name})"],
        cwd=ROOT,
        env=server_env(DATABASE_URL="sqlite:///:memory:"),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def working_tree_changes() -> list[str]:
    """Files that differ from the commit (what a run measured beyond it)."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return [line[3:] for line in done.stdout.splitlines()]


def migrated_database(directory: Path) -> str:
    """A freshly migrated SQLite database in `directory`; returns its DATABASE_URL."""
    return _migrated(f"sqlite:///{directory / 'db.sqlite3'}")


def _migrated(url: str) -> str:
    """The database at `url` brought up to date by `manage.py migrate`; returns `url`."""
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=server_env(DATABASE_URL=url),
        check=True,
    )
    return url


def _postgres_url(admin_url: str, name: str) -> str:
    """The URL of database `name` on the server of `admin_url`."""
    return admin_url.rsplit("/", 1)[0] + "/" + name


def _postgres_admin(admin_url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


def migrated_postgres(admin_url: str, name: str) -> str:
    """A new, migrated PostgreSQL database `name` (a template for postgres_copy); its URL."""
    _postgres_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"')
    return _migrated(_postgres_url(admin_url, name))


def postgres_copy(admin_url: str, template_url: str, name: str) -> str:
    """A new PostgreSQL database `name` copied from `template_url`'s; its URL."""
    template = template_url.rsplit("/", 1)[1]
    _postgres_admin(
        admin_url,
        f'DROP DATABASE IF EXISTS "{name}"',
        f'CREATE DATABASE "{name}" TEMPLATE "{template}"',
    )
    return _postgres_url(admin_url, name)


def drop_postgres(admin_url: str, pattern: str) -> None:
    """Drop the databases whose names match `pattern` (SQL LIKE), the servers stopped."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as connection:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (pattern,)
            )
        ]
        for name in names:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def chatsite(
    database_url: str, llm_base_url: str, *, redis_prefix: str | None = None, **env: str
) -> Iterator[Proc]:
    """chatsite under one daphne process, as `tests/servers.py:running_chatsite` starts it.

    It waits for the port only (not /healthz): any HTTP request would warm the upstream pool,
    and the cold-start benchmark needs a process that has seen none. An empty
    `llm_base_url` means the demo model mounted in the app itself (/demo/v1).
    """
    port = free_port()
    upstream = llm_base_url or f"http://127.0.0.1:{port}/demo/v1"
    extra = {"DATABASE_URL": database_url, "LLM_BASE_URL": upstream, "PORT": str(port)}
    if redis_prefix is not None:
        extra.update(REDIS_URL=REDIS_URL, CHAT_REDIS_PREFIX=redis_prefix)
    with _daphne("chatsite", "chatsite.asgi:application", port, server_env(**extra, **env)) as proc:
        yield proc


@contextlib.contextmanager
def naive_relay(upstream: str) -> Iterator[Proc]:
    """The naive baseline relay (bench/naive_relay.py) under daphne."""
    env = {**os.environ, "NAIVE_UPSTREAM": upstream, "PYTHONUNBUFFERED": "1"}
    with _daphne("naive", "bench.naive_relay:application", free_port(), env) as proc:
        yield proc


@contextlib.contextmanager
def _daphne(name: str, app: str, port: int, env: dict[str, str]) -> Iterator[Proc]:
    """One daphne process serving `app` on `port`, its output in a temporary log; stopped after."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-bench-"))
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [DAPHNE, "-b", "127.0.0.1", "-p", str(port), app],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(port, popen, log_path)
            yield Proc(name, popen, f"http://127.0.0.1:{port}", log_path)
        finally:
            stop(popen)
    shutil.rmtree(workdir, ignore_errors=True)


def signup(base: str, username: str) -> dict[str, str]:
    """Sign up through the real form; returns the cookies of the logged-in session."""
    # No redirect to the chat page: the signup itself is what logs the session in.
    with httpx.Client(base_url=base, timeout=30, trust_env=False) as client:
        client.get("/accounts/signup/")
        response = client.post(
            "/accounts/signup/",
            data={
                "username": username,
                "password1": PASSWORD,
                "password2": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        if response.status_code != 302 or "sessionid" not in client.cookies:
            raise RuntimeError(f"signup failed ({response.status_code}): {response.text[:300]}")
        return {name: str(value) for name, value in client.cookies.items()}


def redis_available() -> bool:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        ok = bool(client.ping())
        client.close()
        return ok
    except redis.RedisError:
        return False


def delete_redis_prefix(prefix: str) -> int:
    """Remove a benchmark's keys (its unique CHAT_REDIS_PREFIX) from Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        return len(keys)
    finally:
        client.close()


def make_users(database_url: str, count: int, prefix: str) -> list[dict[str, str]]:
    """`count` users with a logged-in session each (bench/users.py); their cookies."""
    done = subprocess.run(
        [PYTHON, "-m", "bench.users", database_url, str(count), prefix],
        cwd=ROOT,
        env=server_env(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        check=True,
    )
    keys = json.loads(done.stdout.strip().splitlines()[-1])["sessionid"]
    return [{"sessionid": key} for key in keys]


def log(message: str) -> None:
    """A progress line of the benchmark, on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
