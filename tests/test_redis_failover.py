"""REDIS_URL: one server or Sentinel, checked when settings load; the clients across a failover.

The URL is checked once, loudly, when settings load, and never repeats a password. With
`redis+sentinel://` every client (stream log, limiter, control, health) reaches the primary the
sentinels name, and follows a failover on its own: a Sentinel group of the test's own on
loopback (tests/sentinel.py), whose primary is SIGKILLed. With one server behind a name that
moves (a failover behind DNS or a virtual address, here a TCP hop the test points elsewhere), a
connection kept to the demoted server answers READONLY: it is dropped and the write goes to the
new primary, never dropped. The whole site through a failover: tests/test_sentinel.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from channels_redis.core import RedisChannelLayer
from django.test import AsyncClient

from chat.limits.limiter import Limiter
from chat.limits.plans import UserLimits
from chat.redis_clients import (
    RedisURLError,
    channel_layer_host,
    check_redis_url,
    redis_client,
    sentinel_target,
)
from chat.turns.control import RedisControl
from chat.turns.streamlog import Chunk, RedisStreamLog
from tests.sentinel import REDIS_SERVER, Node, SentinelGroup, sentinel_group, wait_for
from tests.servers import ROOT, base_env
from tests.test_streamlog import OutageProxy

needs_redis_server = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed"
)


# --- the URL --------------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_primary_and_the_credentials() -> None:
    url = "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2,[fd00::3]:26380/mymaster/2"
    target = sentinel_target(url, password="watch")
    assert target is not None
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("fd00::3", 26380))
    assert (target.primary, target.db) == ("mymaster", 2)
    assert (target.username, target.password) == ("app", "s@cret")  # the servers'
    assert (target.sentinel_username, target.sentinel_password) == (None, "watch")
    assert sentinel_target("redis://10.0.0.1:6379/0") is None


def test_the_channel_layer_gets_the_same_setup_in_channels_redis_terms() -> None:
    host = channel_layer_host(
        "redis+sentinel://:pw@127.0.0.1:26379/mymaster", timeout=3, sentinel_password="watch"
    )
    assert host == {
        "master_name": "mymaster",
        "sentinels": [("127.0.0.1", 26379)],
        "sentinel_kwargs": {"socket_timeout": 3, "socket_connect_timeout": 3, "password": "watch"},
        "db": 0,
        "password": "pw",
        "socket_timeout": 15.0,
        "socket_connect_timeout": 3,
    }
    plain = channel_layer_host("redis://:pw@127.0.0.1:6379/3")
    assert (plain["host"], plain["port"], plain["db"], plain["password"]) == (
        "127.0.0.1",
        6379,
        3,
        "pw",
    )
    # Reads outwait channels-redis' blocking BZPOPMIN (redis-py's default of 5 s raced it:
    # a reconnect every 5 s on an idle socket, and a message popped in that instant lost).
    from channels_redis.core import RedisChannelLayer

    for options in (host, plain):
        assert options["socket_timeout"] > RedisChannelLayer.brpop_timeout


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:s3cret@/mymaster", "list the sentinels"),
        ("redis+sentinel://:s3cret@10.0.0.1:26379", "name the primary"),
        ("redis+sentinel://:s3cret@10.0.0.1:26379,/mymaster", "list the sentinels"),
        ("redis+sentinel://:s3cret@10.0.0.1:99999/mymaster", "the port must be 1-65535"),
        ("redis+sentinel://:s3cret@10.0.0.1:http/mymaster", "the port must be 1-65535"),
        ("redis+sentinel://:s3cret@[fd00::1/mymaster", "cannot be read as a URL"),
        ("redis+sentinel://:s3cret@10.0.0.1/mymaster/zero", "only a database number"),
        ("redis+sentinel://:s3cret@10.0.0.1/mymaster/0/1", "only a database number"),
        ("redis+sentinel://:s3cret@10.0.0.1/mymaster?sentinel_password=x", "no query string"),
        ("rediss+sentinel://:s3cret@10.0.0.1/mymaster", "not supported"),
        ("http://:s3cret@10.0.0.1:6379/0", "not a Redis URL"),
        ("redis://:s3cret@10.0.0.1:6379/zero", "the database number"),
        ("redis://:s3cret@10.0.0.1:99999/0", "not a Redis URL"),
    ],
)
def test_a_bad_redis_url_is_refused_saying_why_and_never_repeating_the_password(
    url: str, says: str
) -> None:
    with pytest.raises(RedisURLError) as refused:
        check_redis_url(url)
    assert says in str(refused.value)
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://user:pw@cache.example:6380",
        "unix:///run/redis/redis.sock?db=1",
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster",
    ],
)
def test_good_redis_urls_pass(url: str) -> None:
    check_redis_url(url)


def test_settings_refuse_to_load_with_a_bad_redis_url() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=base_env(REDIS_URL="redis+sentinel://:s3cret@10.0.0.1:26379"),
        capture_output=True,
        text=True,
    )
    assert loaded.returncode != 0
    assert "ImproperlyConfigured: REDIS_URL: name the primary" in loaded.stderr
    assert "s3cret" not in loaded.stderr


# --- Sentinel -------------------------------------------------------------------------------


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with sentinel_group() as started:
        yield started


def user_limits(rate: str) -> UserLimits:
    return UserLimits(
        rate=rate, daily_tokens=0, max_streams=100, plan="test", allow_full_on_mobile=False
    )


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex[:8]}:"


async def kill_the_primary(group: SentinelGroup) -> Node:
    """SIGKILL the primary once the replica has all it wrote; the dead primary."""
    await asyncio.to_thread(wait_for, "the replica to catch up", group.replicated)
    old = group.primary()
    old.kill()
    return old


async def fail_over(group: SentinelGroup) -> Node:
    """SIGKILL the primary; the replica, once the sentinels have promoted it."""
    old = await kill_the_primary(group)
    return await asyncio.to_thread(group.wait_for_new_primary, old)


def key_exists(node: Node, key: str) -> bool:
    client = node.client()
    try:
        return bool(client.keys(f"*{key}"))
    finally:
        client.close()


def stream_entries(node: Node, key: str) -> list[tuple[int, str]]:
    client = node.client()
    try:
        return [(int(f[b"s"]), f[b"t"].decode()) for _, f in client.xrange(key) if b"s" in f]
    finally:
        client.close()


async def test_the_stream_log_writes_every_chunk_once_across_a_failover(
    group: SentinelGroup, prefix: str
) -> None:
    log = RedisStreamLog(group.url, prefix)
    try:
        for seq in range(5):
            log.append("m1", seq, f"{seq},")
        await log.flush()
        new = await fail_over(group)
        # Appended with no primary, or before the writer has found the new one: kept, retried.
        for seq in range(5, 10):
            log.append("m1", seq, f"{seq},")
        await log.flush(timeout=60)
        assert stream_entries(new, f"{prefix}log:m1") == [(s, f"{s},") for s in range(10)]
        # A reader reaches the new primary too.
        async with contextlib.aclosing(log.read("m1", 4, block_ms=100)) as reader:
            read = [await anext(reader) for _ in range(5)]
        assert read == [Chunk(s, f"{s},") for s in range(5, 10)]
    finally:
        await log.aclose()


async def test_stops_sent_during_and_after_a_failover_reach_the_other_instance(
    group: SentinelGroup, prefix: str
) -> None:
    here, there = RedisControl(group.url, prefix), RedisControl(group.url, prefix)
    heard: list[str] = []
    arrived = asyncio.Event()
    there.on_stop(lambda mid: (heard.append(mid), arrived.set()))
    try:
        await there.start()
        old = await kill_the_primary(group)
        # No primary: the stop cannot be published now; it is, once there is one again.
        await here.request_stop("m-during")
        new = await asyncio.to_thread(group.wait_for_new_primary, old)

        def subscribed() -> bool:
            client = new.client()
            try:
                return any(c["name"] == f"{prefix}control-sub" for c in client.client_list())
            finally:
                client.close()

        # The subscriber reconnected on its own, to the promoted replica.
        await asyncio.to_thread(wait_for, "the subscriber on the new primary", subscribed)
        await here.request_stop("m-after")
        await asyncio.wait_for(arrived.wait(), 30)
        assert heard[-1] == "m-after"
        assert await there.stop_requested("m-after")
        # The one sent without a primary: its key is set (the owner's heartbeat polls it).
        await asyncio.to_thread(
            wait_for, "the stop sent during the failover", lambda: key_exists(new, "stop:m-during")
        )
        assert await there.stop_requested("m-during")
    finally:
        await here.aclose()
        await there.aclose()


async def test_the_rate_limit_stays_exact_across_a_failover(
    group: SentinelGroup, prefix: str
) -> None:
    limits = user_limits("6/hour")
    limiter = Limiter(group.url, prefix=prefix, failure="closed")
    admitted = []
    try:
        for _ in range(3):
            admitted.append(await limiter.admit(7, estimate_tokens=1, limits=limits))
        await fail_over(group)
        while True:
            verdict = await limiter.admit(7, estimate_tokens=1, limits=limits)
            if not hasattr(verdict, "settle"):
                break
            admitted.append(verdict)
    finally:
        await limiter.aclose()
    assert len(admitted) == 6
    assert verdict.code == "rate_limited" and verdict.retry_after > 60  # type: ignore[union-attr]


async def test_a_client_closes_its_connections_to_the_sentinels_too(group: SentinelGroup) -> None:
    def ours() -> int:
        """Connections named for our client, on every sentinel."""
        count = 0
        for sentinel in group.sentinels:
            client = sentinel.client()
            try:
                count += sum(c["name"] == "test:probe" for c in client.client_list())
            finally:
                client.close()
        return count

    client = redis_client("probe", url=group.url, prefix="test:")
    assert await client.ping()
    assert ours() > 0  # it asked the sentinels where the primary is
    await client.aclose()
    await asyncio.to_thread(wait_for, "no connection left", lambda: ours() == 0)


async def test_passwords_reach_the_servers_and_the_sentinels_on_every_path(
    settings: Any, prefix: str
) -> None:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with sentinel_group(password="servers-secret", sentinel_password="sentinels-secret") as group:
        # The servers' password is the URL's; the sentinels' comes from its own setting.
        settings.REDIS_SENTINEL_PASSWORD = "sentinels-secret"
        client = redis_client("login", url=group.url, prefix=prefix)
        try:
            assert await client.set(f"{prefix}k", "v")
        finally:
            await client.aclose()
        layer = RedisChannelLayer(
            hosts=[channel_layer_host(group.url, sentinel_password="sentinels-secret")],
            prefix=f"{prefix}asgi",
        )
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "hello"})
        assert await asyncio.wait_for(layer.receive(channel), 10) == {"type": "hello"}
        await layer.flush()

        settings.REDIS_SENTINEL_PASSWORD = ""  # the sentinels refuse to say where it is
        refused = redis_client("login", url=group.url, prefix=prefix, retries=0)
        try:
            with pytest.raises(redis.RedisError):
                await refused.ping()
        finally:
            await refused.aclose()


def cluster_check_redis(url: str) -> subprocess.CompletedProcess[str]:
    """deploy/cluster.sh's check of Redis, as `make cluster` runs it."""
    return subprocess.run(
        [sys.executable, "deploy/cluster_checks.py", "redis"],
        cwd=ROOT,
        env=base_env(REDIS_URL=url),
        capture_output=True,
        text=True,
    )


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_readiness_finds_the_primary_through_the_sentinels_and_says_when_there_is_none(
    group: SentinelGroup, settings: Any
) -> None:
    settings.REDIS_URL = group.url
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["redis"]["ok"] is True
    assert (await asyncio.to_thread(cluster_check_redis, group.url)).returncode == 0

    for node in group.servers:  # no primary and no replica to promote
        node.kill()
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 503
    check = response.json()["checks"]["redis"]
    assert check["ok"] is False
    assert "MasterNotFoundError" in check["error"] or "ConnectionError" in check["error"]
    checked = await asyncio.to_thread(cluster_check_redis, group.url)
    assert checked.returncode == 1
    assert "no Redis primary through the sentinels" in checked.stderr


def test_make_cluster_refuses_a_bad_redis_url_saying_why() -> None:
    checked = cluster_check_redis("redis+sentinel://:s3cret@10.0.0.1:26379")
    assert checked.returncode == 1
    assert "REDIS_URL: name the primary" in checked.stderr
    assert "s3cret" not in checked.stderr


# --- one server behind a name that moves ----------------------------------------------------


@pytest.fixture
def two_servers() -> Iterator[list[Node]]:
    """A primary and its replica, no sentinel: someone else promotes (here, the test)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with sentinel_group(sentinels=0) as started:
        yield started.servers


@pytest.fixture
async def moving_name(two_servers: list[Node]) -> AsyncIterator[OutageProxy]:
    proxy = OutageProxy(f"redis://127.0.0.1:{two_servers[0].port}/0")
    await proxy.up()
    yield proxy
    await proxy.down()


def promote(new: Node, old: Node, proxy: OutageProxy) -> None:
    """The replica becomes the primary, the old primary its replica, the name points at it."""
    new.client().execute_command("REPLICAOF", "NO", "ONE")
    old.client().execute_command("REPLICAOF", "127.0.0.1", str(new.port))
    proxy.upstream = ("127.0.0.1", new.port)  # new connections; kept ones stay on `old`


async def test_a_connection_kept_to_a_demoted_server_is_dropped_and_nothing_is_lost(
    two_servers: list[Node], moving_name: OutageProxy, prefix: str
) -> None:
    old, new = two_servers
    log = RedisStreamLog(moving_name.url, prefix)
    limiter = Limiter(moving_name.url, prefix=prefix, failure="closed")
    limits = user_limits("4/hour")
    try:
        for seq in range(5):
            log.append("m1", seq, f"{seq},")
        await log.flush()
        admitted = [await limiter.admit(7, estimate_tokens=1, limits=limits) for _ in range(2)]
        promote(new, old, moving_name)
        await asyncio.to_thread(
            wait_for, "the old primary to replicate", lambda: old.client().info()["role"] == "slave"
        )
        # The writer's connection still goes to `old`, which now refuses writes (READONLY).
        for seq in range(5, 10):
            log.append("m1", seq, f"{seq},")
        await log.flush(timeout=30)
        assert stream_entries(new, f"{prefix}log:m1") == [(s, f"{s},") for s in range(10)]
        while hasattr(
            verdict := await limiter.admit(7, estimate_tokens=1, limits=limits), "settle"
        ):
            admitted.append(verdict)
        assert len(admitted) == 4, "the two counted on the old primary were replicated"
    finally:
        await log.aclose()
        await limiter.aclose()
