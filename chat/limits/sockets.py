"""Caps on open sockets per user and per client address, counted across every instance.

One account could open sockets without limit (the review opened 400 in 2.7 s), and every
socket costs memory, a group membership and work per event. The handshake takes a place in
two capped sets — the user's and the address's — and the socket gives it back when it ends.
With Redis the sets are shared by every instance: a sorted set per user and per address whose
members (one per socket) carry a lease, extended by one job per process for all its sockets,
so the places of a crashed instance's sockets come back when their lease runs out. Without
Redis the sets live in this process.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from django.conf import settings

from chat import metrics
from chat.loops import PerLoop, cancel_and_wait
from chat.redis_clients import REDIS_DOWN, redis_client

logger = logging.getLogger(__name__)

Verdict = Literal["ok", "user", "address"]

# Take a place in one capped set (a sorted set scored by lease expiry, in Redis's own clock so
# instances' clock skew cannot expire each other's places). 1: taken, 0: full.
_TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease + 1000)
return 1
"""

_EXTEND_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], lease + 1000)
end
return 1
"""


@dataclass(frozen=True)
class Place:
    """The places one open socket holds: give them back with `SocketCounter.release`."""

    user_id: int
    address: str
    socket_id: str


class SocketCounter:
    """Counts open sockets per user and per address; refuses a handshake over either cap."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        prefix: str | None = None,
        per_user: int | None = None,
        per_address: int | None = None,
        lease_seconds: float | None = None,
    ) -> None:
        """Defaults come from settings; tests pass their own."""
        url = settings.REDIS_URL if redis_url is None else redis_url
        self.prefix = settings.CHAT_REDIS_PREFIX if prefix is None else prefix
        self.per_user = settings.CHAT_MAX_SOCKETS_PER_USER if per_user is None else per_user
        self.per_address = (
            settings.CHAT_MAX_SOCKETS_PER_ADDRESS if per_address is None else per_address
        )
        self.lease_seconds = (
            settings.CHAT_SOCKET_LEASE_SECONDS if lease_seconds is None else lease_seconds
        )
        self._lease_ms = max(1000, int(self.lease_seconds * 1000))
        self._client: aioredis.Redis | None = None
        if url:
            self._client = redis_client(
                "sockets", url=url, prefix=self.prefix, socket_timeout=1.0, retries=1
            )
            self._take = self._client.register_script(_TAKE_LUA)
            self._extend = self._client.register_script(_EXTEND_LUA)
        # This process's places: counted here without Redis, and extended from here with it.
        self._held: dict[str, Place] = {}
        self._users: Counter[int] = Counter()
        self._addresses: Counter[str] = Counter()
        self._refresher: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        backend = "redis" if self._client is not None else "memory"
        return f"<SocketCounter {backend} user≤{self.per_user} address≤{self.per_address}>"

    def _user_key(self, user_id: int) -> str:
        return f"{self.prefix}{{s:u:{user_id}}}:sockets"

    def _address_key(self, address: str) -> str:
        return f"{self.prefix}{{s:a:{address}}}:sockets"

    async def take(self, user_id: int, address: str) -> Place | Verdict:
        """A place for a new socket, or which cap refused it ("user" or "address")."""
        place = Place(user_id, address, uuid.uuid4().hex)
        if self._client is None:
            verdict = self._take_here(place)
        else:
            verdict = await self._take_shared(place)
        if verdict != "ok":
            return verdict
        self._held[place.socket_id] = place
        self._users[place.user_id] += 1
        self._addresses[place.address] += 1
        if self._client is not None and (self._refresher is None or self._refresher.done()):
            self._refresher = asyncio.get_running_loop().create_task(
                self._extend_forever(), name="socket places"
            )
        return place

    def release(self, place: Place) -> None:
        """Give the socket's places back (never blocks: a closing socket may be cancelled)."""
        if self._held.pop(place.socket_id, None) is None:
            return
        _decrement(self._users, place.user_id)
        _decrement(self._addresses, place.address)
        if self._client is None:
            return
        task = asyncio.get_running_loop().create_task(self._release_shared(place))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    def open_here(self) -> int:
        """Sockets holding a place in this process (for tests and the metrics)."""
        return len(self._held)

    def _take_here(self, place: Place) -> Verdict:
        if self.per_user and self._users[place.user_id] >= self.per_user:
            return "user"
        if self.per_address and self._addresses[place.address] >= self.per_address:
            return "address"
        return "ok"

    async def _take_shared(self, place: Place) -> Verdict:
        assert self._client is not None
        user_key, address_key = self._user_key(place.user_id), self._address_key(place.address)
        try:
            # Two sets, each taken atomically (their keys may live on different cluster
            # nodes); both in one round trip, and a place taken in one is given back if the
            # other is full.
            async with self._client.pipeline(transaction=False) as pipe:
                await self._take(
                    keys=[user_key],
                    args=[place.socket_id, self._lease_ms, self.per_user],
                    client=pipe,
                )
                await self._take(
                    keys=[address_key],
                    args=[place.socket_id, self._lease_ms, self.per_address],
                    client=pipe,
                )
                user_ok, address_ok = await pipe.execute()
            if user_ok and address_ok:
                return "ok"
            async with self._client.pipeline(transaction=False) as pipe:
                if user_ok:
                    pipe.zrem(user_key, place.socket_id)
                if address_ok:
                    pipe.zrem(address_key, place.socket_id)
                await pipe.execute()
            return "user" if not user_ok else "address"
        except REDIS_DOWN as exc:
            # A socket is not refused because Redis is away: counting resumes with it.
            metrics.limiter_failed("socket_take")
            logger.warning("socket caps unavailable (%s); the socket is let in", exc)
            return "ok"

    async def _release_shared(self, place: Place) -> None:
        assert self._client is not None
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zrem(self._user_key(place.user_id), place.socket_id)
                pipe.zrem(self._address_key(place.address), place.socket_id)
                await pipe.execute()
        except REDIS_DOWN as exc:
            metrics.limiter_failed("socket_release")
            logger.info("socket place of user %s left to expire: %s", place.user_id, exc)

    async def _extend_forever(self) -> None:
        """Extend every place this process holds, a third of a lease before it runs out."""
        assert self._client is not None
        while self._held:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    for place in list(self._held.values()):
                        for key in (
                            self._user_key(place.user_id),
                            self._address_key(place.address),
                        ):
                            await self._extend(
                                keys=[key], args=[place.socket_id, self._lease_ms], client=pipe
                            )
                    await pipe.execute()
            except REDIS_DOWN as exc:
                metrics.limiter_failed("socket_extend")
                logger.warning("could not extend the socket places (%s); retrying", exc)

    async def aclose(self) -> None:
        if self._refresher is not None:
            await cancel_and_wait(self._refresher)
        if self._releasing:
            await asyncio.wait(list(self._releasing), timeout=2)
        if self._client is not None:
            await self._client.aclose()


def _decrement(counts: Counter[Any], key: Any) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]  # a process serving many users must not keep a key per user seen


def _config() -> Hashable:
    return (
        settings.REDIS_URL,
        settings.CHAT_REDIS_PREFIX,
        settings.CHAT_MAX_SOCKETS_PER_USER,
        settings.CHAT_MAX_SOCKETS_PER_ADDRESS,
        settings.CHAT_SOCKET_LEASE_SECONDS,
    )


async def _close(counter: SocketCounter) -> None:
    await counter.aclose()


socket_counters: PerLoop[SocketCounter] = PerLoop(
    "socket counter", SocketCounter, _close, config=_config
)


def get_socket_counter() -> SocketCounter:
    """This process's socket counter for the running event loop, configured from settings."""
    return socket_counters.get()
