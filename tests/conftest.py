"""Shared pytest fixtures: named users, sockets on the real ASGI app, the demo model, Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from importlib import import_module
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from chat.ops.startup import close_services

DESKTOP_UA = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)
PHONE_UA = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1"
)
REDIS_URL = "redis://127.0.0.1:6379/0"


def pytest_configure(config: pytest.Config) -> None:
    """Passwords made in the tests' own process are cheap to hash (tests/hashers.py)."""
    from django.conf import settings

    settings.PASSWORD_HASHERS = [
        "tests.hashers.QuickPBKDF2PasswordHasher",
        *settings.PASSWORD_HASHERS,
    ]
    config.pluginmanager.register(SlowFirst(), "chatsite-slow-first")


# The modules that take a minute or more (`pytest --durations`, 2026-12-01), slowest first.
# xdist hands out whole files (--dist loadfile) in collection order (the Makefile turns off its
# reordering by test count, which put these last and left one worker running them alone for
# minutes at the end); a file not listed keeps its place after these.
SLOW_FIRST = (
    "tests/test_security_http_fuzz.py",
    "tests/test_backpressure.py",
    "tests/test_bench_smoke.py",
    "tests/test_paging_servers.py",
    "tests/test_daphne.py",
    "tests/test_security_logins.py",
    "tests/test_reliability_load.py",
    "tests/test_security_sockets.py",
    "tests/test_reliability_restart.py",
    "tests/browser/test_console.py",
    "tests/test_health.py",
    "tests/test_cluster.py",
    "tests/test_quota_daphne.py",
    "tests/test_security_demo.py",
    "tests/test_sentinel.py",
    "tests/test_security_fuzz_postgres.py",
    "tests/test_security_respelled_postgres.py",
    "tests/browser/test_xss.py",
    "tests/browser/test_limits.py",
    "tests/browser/test_paging.py",
    "tests/browser/test_sidebar.py",
    "tests/browser/test_sharing.py",
)


class SlowFirst:
    """Orders the collected tests by SLOW_FIRST, after every other plugin ordered them."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        rank = {path: i for i, path in enumerate(SLOW_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def demo_upstream() -> Iterator[str]:
    """The standalone demo model over real HTTP, as fast as it goes."""
    from tests.demo_server import running_demo_server

    with running_demo_server(ttfb_ms=0, tps=0) as url:
        yield url


@pytest.fixture(scope="session")
def slow_demo_upstream() -> Iterator[str]:
    """The demo model at 100 tokens/s: answers long enough to stop or drop mid-way."""
    from tests.demo_server import running_demo_server

    with running_demo_server(ttfb_ms=20, tps=100) as url:
        yield url


@pytest.fixture
def chat_settings(settings: Any, demo_upstream: str) -> Any:
    settings.LLM_BASE_URL = demo_upstream
    settings.REDIS_URL = ""
    settings.CHAT_RATE_LIMIT = "1000/minute"
    settings.CHAT_MAX_CONCURRENT_STREAMS = 20
    settings.CHAT_DAILY_TOKENS = 0
    # Titles are an extra upstream request after a first answer: on only where a test asks.
    settings.CHAT_TITLES = False
    settings.CHAT_REDIS_PREFIX = f"test:{uuid.uuid4().hex[:10]}:"
    return settings


@pytest.fixture
def redis_prefix(settings: Any) -> Iterator[str]:
    """Isolate a test's Redis keys under a unique prefix and delete them afterwards."""
    prefix = f"test:{uuid.uuid4().hex[:10]}:"
    settings.CHAT_REDIS_PREFIX = prefix
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def owner(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("owner", password="owner-pass-123456")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("other", password="other-pass-123456")


def session_key_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


Connect = Callable[..., Awaitable[WebsocketCommunicator]]


@pytest.fixture
async def closed_services() -> AsyncIterator[None]:
    """For a test that calls the real ASGI application itself: the services its first request
    started on the test's loop (the upstream pool, Redis clients) are closed after it, as a
    shutdown does, not left to be collected unclosed at the interpreter's exit."""
    yield
    await close_services()


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Open sockets on the real ASGI application; every one is closed after the test."""
    from chatsite.asgi import application

    opened: list[WebsocketCommunicator] = []

    async def _connect(
        user: Any | None,
        *,
        origin: str | None = "http://127.0.0.1:8000",
        user_agent: str = DESKTOP_UA,
        extra_headers: list[tuple[bytes, bytes]] | None = None,
        expect_ready: bool = True,
        showing: str = "",
    ) -> WebsocketCommunicator:
        headers = [(b"host", b"127.0.0.1:8000"), (b"user-agent", user_agent.encode())]
        if origin is not None:
            headers.append((b"origin", origin.encode()))
        if user is not None:
            key = await database_sync_to_async(session_key_for)(user)
            headers.append((b"cookie", f"sessionid={key}".encode()))
        headers.extend(extra_headers or [])
        # `showing`: the conversation the tab's page shows, as the page's socket URL says.
        path = f"/ws/chat/?conversation={showing}" if showing else "/ws/chat/"
        comm = WebsocketCommunicator(application, path, headers=headers)
        opened.append(comm)
        connected, _ = await comm.connect(timeout=10)
        comm.connected = connected  # type: ignore[attr-defined]
        if connected and expect_ready:
            ready = json.loads(await comm.receive_from(timeout=10))
            assert ready["type"] == "ready"
            comm.ready = ready  # type: ignore[attr-defined]
        return comm

    yield _connect
    for comm in opened:
        # A receive that timed out has cancelled its application already (asgiref does): it
        # has nothing to disconnect, and the others and the services are still closed.
        if not comm.future.done():
            await comm.disconnect()
    # Each test has its own loop: its Redis subscriber and writer tasks are closed here, as a
    # shutdown does, rather than left for the loop's teardown to cancel mid-handshake.
    await close_services()


async def receive_until_done(
    comm: WebsocketCommunicator, mid: str | None = None, timeout: float = 20, after: int = -1
) -> dict[str, Any]:
    """Collect frames until the `done` of `mid` (or of the first answer): chunks, html, done.

    Chunks must arrive without duplicates and, from `after + 1` on, without gaps.
    """
    chunks: dict[int, str] = {}
    html: list[str] = []
    errors: list[dict[str, Any]] = []
    order: list[str] = []
    while True:
        raw = await comm.receive_from(timeout=timeout)
        if not raw.startswith("{"):
            html.append(raw)
            order.append("html")
            continue
        frame = json.loads(raw)
        order.append(frame["type"])
        if frame["type"] == "chunk" and (mid is None or frame["mid"] == mid):
            assert frame["seq"] not in chunks, "a chunk arrived twice"
            chunks[frame["seq"]] = frame["text"]
            mid = frame["mid"]
        elif frame["type"] == "error":
            errors.append(frame)
        elif frame["type"] == "done" and (mid is None or frame["mid"] == mid):
            text = "".join(chunks[i] for i in sorted(chunks))
            assert sorted(chunks) == list(range(after + 1, after + 1 + len(chunks))), "a gap"
            return {"done": frame, "text": text, "html": html, "errors": errors, "order": order}


def assistant_mid(html: str) -> str:
    import re

    match = re.search(r'class="msg msg-assistant" id="msg-([^"]+)"', html)
    assert match, html
    return match.group(1)


@pytest.fixture
def real_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _seeded_tiers(request: pytest.FixtureRequest) -> None:
    """What the migrations left in the test database (content types, permissions, the seeded
    tiers, rules and plans), for every test that uses the database. A serialized transactional
    test that ran before in this worker (the order of files differs in each xdist worker) ends
    with a flush and restores the data only at the start of the next serialized test, so a
    plain test after it found no tiers, no plans and no permissions (a view-only admin got
    403). Restored here as Django restores it for a serialized test, inside this test's
    transaction."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None or marker.kwargs.get("transaction") or (marker.args and marker.args[0]):
        return  # no database, or a transactional test (flushed and restored by design)
    request.getfixturevalue("db")
    from django.apps import apps
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from chat.models import ModelTier

    serialized = getattr(connection, "_test_serialized_contents", None)
    if serialized and not ContentType.objects.exists():
        connection.creation.deserialize_db_from_string(serialized)
    elif not ModelTier.objects.exists():
        import_module("chat.migrations.0002_seed_tiers").seed(apps, None)


@pytest.hookimpl(tryfirst=True)  # before pytest-django orders transactional tests last
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Sockets and turns use threads for the ORM: their tests need committed data, and the
    # seeded tiers and rules restored after each flush.
    for item in items:
        if "connect" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.django_db(transaction=True, serialized_rollback=True))
        marker = item.get_closest_marker("django_db")
        if (
            marker
            and marker.kwargs.get("transaction")
            and not marker.kwargs.get("serialized_rollback")
        ):
            # Its flush re-creates the content types under new ids; every serialized test
            # after it in the worker then fails to restore them (IntegrityError in set-up:
            # 114 errors in one CI run). Transactional tests here all restore the seeded data.
            raise pytest.UsageError(
                f"{item.nodeid}: mark transactional tests serialized_rollback=True as well"
            )
