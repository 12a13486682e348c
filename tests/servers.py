"""Real servers for tests: chatsite under daphne on a free port, with its own SQLite database."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
_template_db: Path | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAT_", "LLM_", "DEMO_"))}
    env.pop("REDIS_URL", None)
    env.pop("DATABASE_URL", None)
    env.update(
        # chatsite.settings with cheap password hashes (tests/server_settings.py).
        DJANGO_SETTINGS_MODULE="tests.server_settings",
        DJANGO_DEBUG="0",
        DJANGO_SECURE="0",
        DJANGO_SECRET_KEY="tests-only-not-a-secret-0123456789abcdefghijklmnop",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        DEMO_TTFB_MS="0",
        DEMO_TOKENS_PER_SECOND="0",
        # SIGTERM drains running answers for this long (chat/ops/shutdown.py): keep teardowns quick.
        CHAT_SHUTDOWN_GRACE="1",
        # Tests sign up and log in many users from 127.0.0.1; the tests of these throttles
        # (tests/test_security_logins.py) set their own.
        CHAT_SIGNUP_RATE_PER_ADDRESS="100000/hour",
        CHAT_LOGIN_RATE_PER_ADDRESS="100000/hour",
        CHAT_LOGIN_RATE_PER_USERNAME="100000/hour",
        # Tests reload and reconnect one account's tabs far more often than a person does; the
        # tests of this rate (tests/test_resume_storm.py) set their own, or its default.
        CHAT_SOCKET_RATE="100000/minute",
        # Tests load one account's pages far more often than a person does; the tests of this
        # rate (tests/test_page_rate.py) set their own.
        CHAT_PAGE_RATE="100000/minute",
        # A conversation's title is one more (background) request that holds a stream slot
        # for a moment: tests that count requests and streams exactly do without it; the tests
        # of titles, and of a stolen session (a title is news for the tabs too), turn it on.
        CHAT_TITLES="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def migrated_sqlite(directory: Path) -> str:
    """A migrated SQLite file for a server (migrations run once per test session, then copied)."""
    global _template_db
    if _template_db is None:
        tmpl = Path(tempfile.mkdtemp(prefix="chatsite-tmpl-")) / "template.sqlite3"
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=base_env(DATABASE_URL=f"sqlite:///{tmpl}"),
            check=True,
        )
        _template_db = tmpl
    target = directory / "db.sqlite3"
    shutil.copy(_template_db, target)
    return f"sqlite:///{target}"


def wait_until_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    """Wait for the server to answer; a loaded machine (CI beside Chromium) can take a while."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} did not come up in {timeout} s")


@contextlib.contextmanager
def running_chatsite(
    *, database_url: str | None = None, port: int | None = None, **env: str
) -> Iterator[str]:
    """Start chatsite under daphne; yield its base URL; stop it (and wait) afterwards."""
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-srv-"))
    db = database_url or migrated_sqlite(workdir)
    environment = base_env(DATABASE_URL=db, PORT=str(port), **env)
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "chatsite.asgi:application",
        ],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/healthz", proc)
        yield base
    except BaseException:
        # The test failed with the server up: its log goes into the report (pytest shows a
        # failing test's stderr), or it would be deleted with the server's directory below.
        log.flush()
        show_log_tail(workdir / "server.log", base)
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def show_log_tail(path: Path, base: str, lines: int = 80) -> None:
    """Print the end of a server's log to stderr, named by the server's address."""
    with contextlib.suppress(OSError):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- the last {len(tail)} lines of the log of {base} ---", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)


def signup(base: str, username: str, password: str = "a-long-test-passphrase-42") -> httpx.Client:
    """Sign up through the real form; return a client holding the session cookie."""
    client = httpx.Client(base_url=base, follow_redirects=True, timeout=10)
    client.get("/accounts/signup/")
    token = client.cookies["csrftoken"]
    response = client.post(
        "/accounts/signup/",
        data={
            "username": username,
            "password1": password,
            "password2": password,
            "csrfmiddlewaretoken": token,
        },
    )
    response.raise_for_status()
    if "sessionid" not in client.cookies:
        raise RuntimeError(f"signup failed: {response.text[:500]}")
    return client
