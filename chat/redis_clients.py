"""Redis clients for every use of Redis (limiter, stream log, control channel, health, the channel
layer's hosts), made in one place from `REDIS_URL`: one server, or the primary Sentinel names."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

# What "Redis is away" looks like to a caller: redis-py's own errors (a primary that Sentinel
# cannot name yet, or a server that was demoted, is a ConnectionError too), refused or reset
# sockets, timeouts.
from redis.exceptions import ConnectionError, ReadOnlyError, RedisError

REDIS_DOWN: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379


class RedisURLError(ValueError):
    """REDIS_URL cannot be used; the message says why (and never repeats a password)."""


@dataclass(frozen=True)
class SentinelURL:
    """What a `redis+sentinel://` URL says: where the sentinels are, which primary, how to log in.

    `redis+sentinel://[user:password@]host[:port][,host[:port]…]/<primary name>[/<db>]`: the
    credentials before `@` are the Redis servers' (primary and replicas). The sentinels' own
    (`requirepass` in sentinel.conf), when they have any, come from REDIS_SENTINEL_USERNAME and
    REDIS_SENTINEL_PASSWORD: secrets stay out of query strings, and may be mounted as files.
    """

    sentinels: tuple[tuple[str, int], ...]
    primary: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def server_options(self) -> dict[str, Any]:
        """Connection options for the primary (database and credentials)."""
        options: dict[str, Any] = {"db": self.db}
        if self.username:
            options["username"] = self.username
        if self.password:
            options["password"] = self.password
        return options

    def sentinel_options(self, timeout: float, name: str | None = None) -> dict[str, Any]:
        """Connection options for the sentinels: a dead sentinel must cost at most `timeout`."""
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if name:
            options["client_name"] = name
        if self.sentinel_username:
            options["username"] = self.sentinel_username
        if self.sentinel_password:
            options["password"] = self.sentinel_password
        return options


def _address(item: str) -> tuple[str, int]:
    """`host[:port]` or `[v6 address][:port]` of one sentinel."""
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise RedisURLError(f"sentinel address {item!r} is not [IPv6 address]:port")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise RedisURLError(f"sentinel address {item!r} has no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RedisURLError(f"sentinel address {item!r}: the port must be 1-65535")
    return host, int(port_text)


def _split(url: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise RedisURLError(f"it cannot be read as a URL ({exc})") from None


def parse_sentinel_url(url: str) -> SentinelURL:
    """The parts of a `redis+sentinel://` URL; RedisURLError saying what is wrong."""
    parts = _split(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise RedisURLError(f"a Sentinel URL starts with {SENTINEL_SCHEME}://")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user_text, colon, password_text = userinfo.partition(":")
        username = unquote(user_text) or None
        password = unquote(password_text) if colon else None
    items = [item.strip() for item in hosts.split(",")]
    if not hosts or not all(items):
        raise RedisURLError(
            "list the sentinels as host:port,host:port (e.g. redis+sentinel://"
            "10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster)"
        )
    sentinels = tuple(_address(item) for item in items)
    path = [unquote(segment) for segment in parts.path.split("/")[1:]]
    if not path or not path[0]:
        raise RedisURLError("name the primary after the sentinels: …:26379/<primary name>[/<db>]")
    if len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise RedisURLError("after the primary's name only a database number may follow (/0)")
    if parts.query or parts.fragment:
        raise RedisURLError(
            "a Sentinel URL takes no query string (the sentinels' own credentials are "
            "REDIS_SENTINEL_USERNAME and REDIS_SENTINEL_PASSWORD)"
        )
    return SentinelURL(
        sentinels=sentinels,
        primary=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        username=username,
        password=password,
    )


def sentinel_target(url: str, *, username: str = "", password: str = "") -> SentinelURL | None:
    """The Sentinel setup `url` names, with the sentinels' own credentials if they have any;
    None for one server (`redis://`, `rediss://`, `unix://`)."""
    if _split(url).scheme != SENTINEL_SCHEME:
        return None
    target = parse_sentinel_url(url)
    return replace(target, sentinel_username=username or None, sentinel_password=password or None)


def check_redis_url(url: str) -> None:
    """Raise RedisURLError unless `url` is a Redis URL chatsite can use (settings load calls it)."""
    parts = _split(url)
    if parts.scheme == SENTINEL_SCHEME:
        parse_sentinel_url(url)
        return
    if parts.scheme == "rediss+sentinel":
        raise RedisURLError("TLS to Sentinel (rediss+sentinel://) is not supported")
    try:
        parse_url(url)
    except ValueError as exc:
        raise RedisURLError(
            f"not a Redis URL ({exc}); use redis://, rediss://, unix:// or {SENTINEL_SCHEME}://"
        ) from None
    database = parts.path.strip("/")
    if parts.scheme != "unix" and database and not database.isdigit():
        raise RedisURLError(f"the path is the database number (/0), not {database!r}")


class _PrimaryOnly(AbstractConnection):
    """A connection that treats READONLY as an outage: its server is no longer the primary.

    chatsite only ever writes, so a replica is of no use to it. A server demoted under a kept
    connection (a failover behind a DNS name, or a primary that came back as a replica) answers
    every write with READONLY; this drops the connection, so the next one finds the primary,
    and raises ConnectionError, which every caller already treats as "Redis is away".
    """

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ReadOnlyError as exc:
            await self.disconnect()
            raise ConnectionError(f"{exc} (no longer the primary; reconnecting)") from exc


class PrimaryConnection(_PrimaryOnly, Connection):
    pass


class PrimarySSLConnection(_PrimaryOnly, SSLConnection):
    pass


class PrimaryUnixConnection(_PrimaryOnly, UnixDomainSocketConnection):
    pass


_PRIMARY_ONLY = {
    Connection: PrimaryConnection,
    SSLConnection: PrimarySSLConnection,
    UnixDomainSocketConnection: PrimaryUnixConnection,
}


def server_options(url: str) -> dict[str, Any]:
    """Connection options of a one-server URL, with connections that leave a demoted server."""
    options: dict[str, Any] = dict(parse_url(url))
    options["connection_class"] = _PRIMARY_ONLY[options.get("connection_class", Connection)]
    return options


# Longer than channels-redis' BZPOPMIN timeout (5 s, RedisChannelLayer.brpop_timeout).
LAYER_READ_TIMEOUT = 15.0


def channel_layer_host(
    url: str, *, timeout: float = 2.0, sentinel_username: str = "", sentinel_password: str = ""
) -> dict[str, Any]:
    """One entry of channels-redis' `hosts` for `url`: one server, or its Sentinel setup."""
    target = sentinel_target(url, username=sentinel_username, password=sentinel_password)
    # channels-redis blocks in BZPOPMIN for up to 5 s; redis-py's own default read timeout is
    # also 5 s, so the two race: the client gives up (a reconnect, and a message the server
    # popped in that instant is lost). Reads wait longer than the server ever blocks.
    reads = {"socket_timeout": LAYER_READ_TIMEOUT, "socket_connect_timeout": timeout}
    if target is None:
        return {**server_options(url), **reads}
    return {
        "master_name": target.primary,
        "sentinels": list(target.sentinels),
        "sentinel_kwargs": target.sentinel_options(timeout),
        **target.server_options(),
        **reads,
    }


def client_name(prefix: str, role: str) -> str:
    """The name a connection shows in CLIENT LIST (no spaces: CLIENT SETNAME refuses them)."""
    return re.sub(r"[^\w:.-]", "_", f"{prefix}{role}")


class PrimaryPool(SentinelConnectionPool):
    """Connections to the primary that Sentinel names now; it owns its sentinel connections.

    Each new connection asks the sentinels where the primary is, so after a failover the next
    connection reaches the promoted replica; a connection that finds its server demoted (READONLY)
    is dropped and reported as a ConnectionError, which every caller treats as an outage.
    """

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.sentinel_manager.aclose()


class BlockingPrimaryPool(PrimaryPool, aioredis.BlockingConnectionPool):
    """PrimaryPool with a cap: beyond `max_connections` a caller waits up to `timeout`."""


def redis_client(
    role: str,
    *,
    url: str | None = None,
    prefix: str | None = None,
    max_connections: int | None = None,
    pool_timeout: float | None = None,
    socket_timeout: float | None = 5.0,
    connect_timeout: float = 2.0,
    retries: int = 1,
    decode_responses: bool = True,
) -> aioredis.Redis:
    """A client with its own pool for one `role` of this process.

    With `max_connections` the pool blocks up to `pool_timeout` seconds for a free connection
    (None: forever) instead of opening more. `retries` immediate retries cover a pooled
    connection that Redis closed while idle (or a primary that failed over); callers that retry
    on their own schedule pass 0.
    """
    url = settings.REDIS_URL if url is None else url
    prefix = settings.CHAT_REDIS_PREFIX if prefix is None else prefix
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), retries),
        "decode_responses": decode_responses,
        "client_name": client_name(prefix, role),
    }
    target = sentinel_target(
        url, username=settings.REDIS_SENTINEL_USERNAME, password=settings.REDIS_SENTINEL_PASSWORD
    )
    pool: aioredis.ConnectionPool
    if target is not None:
        sentinel = Sentinel(
            target.sentinels,
            sentinel_kwargs=target.sentinel_options(connect_timeout, options["client_name"]),
        )
        options.update(target.server_options())
        if max_connections is None:
            pool = PrimaryPool(target.primary, sentinel, **options)
        else:
            pool = BlockingPrimaryPool(
                target.primary,
                sentinel,
                max_connections=max_connections,
                timeout=pool_timeout,
                **options,
            )
    else:
        # As ConnectionPool.from_url does it: what the URL says wins over our defaults.
        options.update(server_options(url))
        if max_connections is None:
            pool = aioredis.ConnectionPool(**options)
        else:
            pool = aioredis.BlockingConnectionPool(
                max_connections=max_connections, timeout=pool_timeout, **options
            )
    return aioredis.Redis.from_pool(pool)
