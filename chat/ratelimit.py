"""Per-user limits on chat turns: the request rate, the daily token quota, concurrent streams.

One core for two thin adapters (the socket's ASGI middleware, the HTTP middleware). Counting
lives in Redis when `REDIS_URL` is set, so every instance shares it, and in this process's
memory otherwise. The design and its numbers: docs/decisions/rate-limiting.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, Literal, NamedTuple, Protocol

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.signals import setting_changed
from django.db.models.signals import post_delete, post_save
from limits import RateLimitItem, parse_many
from limits.aio.storage import MemoryStorage, RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from chat.models import Plan, Quota

logger = logging.getLogger(__name__)

# How often the limiter could not reach its storage, per operation. The lead exports these to
# Prometheus later; a plain dict keeps this module free of a metrics dependency meanwhile.
limiter_failures: dict[str, int] = {}

# What "Redis is down" looks like: redis-py's own errors, refused/reset sockets, timeouts.
_STORAGE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

RejectionCode = Literal["rate_limited", "quota_exceeded", "too_many_streams"]

DEFAULT_LEASE_SECONDS = 30.0
# A day's token counter must outlive the day (turns that settle after midnight reconcile
# against the day they reserved on) but not linger: two days.
TOKEN_KEY_TTL_SECONDS = 2 * 86400
# With the cap reached we cannot know when a stream will end; this is a polite pause for
# clients that retry on their own, not a promise.
STREAMS_RETRY_AFTER = 5
UNAVAILABLE_RETRY_AFTER = 5
LIMITS_CACHE_SECONDS = 2.0


@dataclass(frozen=True)
class UserLimits:
    """The limits in force for one user, resolved Quota → its plan → default plan → settings."""

    rate: str
    daily_tokens: int  # 0 = unlimited
    max_streams: int
    plan: str
    allow_full_on_mobile: bool


@dataclass(frozen=True)
class Rejection:
    """Why a prompt or request was refused, in words for the user, and when to come back."""

    code: RejectionCode
    message: str
    retry_after: int  # seconds, >= 1
    reset_at: float  # epoch seconds


# --- resolving a user's limits ------------------------------------------------------------

_limits_cache: dict[int, tuple[float, UserLimits]] = {}


def _valid_rate(rate: str) -> bool:
    try:
        return bool(_parse_rate(rate))
    except ValueError:
        return False


def resolve_limits(user_id: int) -> UserLimits:
    """The user's limits straight from the database (sync, uncached: the admin's lists)."""
    quota = Quota.objects.select_related("plan").filter(user_id=user_id).first()
    default_plan = Plan.objects.filter(is_default=True).order_by("id").first()
    plan = (quota.plan if quota else None) or default_plan
    layers: list[Quota | Plan] = [x for x in (quota, plan, default_plan) if x is not None]

    rate = settings.CHAT_RATE_LIMIT
    for layer in layers:
        if layer.rate_limit.strip():
            if _valid_rate(layer.rate_limit):
                rate = layer.rate_limit.strip()
                break
            # An admin typo must not lock the user out or lift their limit: skip the layer.
            logger.warning("ignoring invalid rate limit %r on %r", layer.rate_limit, layer)

    def first(field: str, fallback: int) -> int:
        for layer in layers:
            value = getattr(layer, field)
            if value is not None:
                return int(value)
        return fallback

    return UserLimits(
        rate=rate,
        daily_tokens=first("daily_tokens", settings.CHAT_DAILY_TOKENS),
        max_streams=first("max_concurrent_streams", settings.CHAT_MAX_CONCURRENT_STREAMS),
        plan=plan.name if plan else "default",
        allow_full_on_mobile=plan.allow_full_on_mobile if plan else False,
    )


# chat.admin imported the private name first; kept until it uses resolve_limits.
_resolve_limits = resolve_limits


async def limits_for(user_id: int) -> UserLimits:
    """The user's limits; cached ~2 s in this process, dropped at once when an admin edits."""
    now = time.monotonic()
    cached = _limits_cache.get(user_id)
    if cached and cached[0] > now:
        return cached[1]
    resolved: UserLimits = await database_sync_to_async(resolve_limits)(user_id)
    _limits_cache[user_id] = (now + LIMITS_CACHE_SECONDS, resolved)
    return resolved


def forget_cached_limits(**_: Any) -> None:
    """Drop every cached resolution: one plan edit can change many users' limits."""
    _limits_cache.clear()


for _model in (Plan, Quota):
    _uid = f"ratelimit-forget-{_model.__name__}"
    post_save.connect(forget_cached_limits, sender=_model, dispatch_uid=f"{_uid}-saved")
    post_delete.connect(forget_cached_limits, sender=_model, dispatch_uid=f"{_uid}-deleted")


# --- words for the user --------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """42 s, 3 min 5 s, 3 h 12 min, 2 d 4 h: the precision a person waiting needs."""
    s = max(1, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        minutes, rest = divmod(s, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if s < 86400:
        hours, rest = divmod(s, 3600)
        minutes = rest // 60
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, rest = divmod(s, 86400)
    hours = rest // 3600
    return f"{days} d {hours} h" if hours else f"{days} d"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def describe_rate(item: RateLimitItem, noun: str = "message") -> str:
    """'20 messages per minute', '3 messages every 2 seconds'."""
    unit = item.GRANULARITY.name
    per = f"per {unit}" if item.multiples == 1 else f"every {item.multiples} {unit}s"
    return f"{_plural(item.amount, noun)} {per}"


@lru_cache(maxsize=256)
def _parse_rate(rate: str) -> tuple[RateLimitItem, ...]:
    # Shortest window first: a prompt refused by the minute limit then costs nothing from
    # the day's allowance (a hit that passes stays counted even if a later limit refuses).
    return tuple(sorted(parse_many(rate), key=lambda item: item.get_expiry()))


def _utc_day(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


def _next_utc_midnight(epoch: float) -> float:
    day = datetime.fromtimestamp(epoch, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day + timedelta(days=1)).timestamp()


# --- storage backends for slots and token reservations --------------------------------------


class _Verdict(NamedTuple):
    status: Literal["ok", "streams", "tokens"]
    streams: int  # live slots (after ours, when admitted)
    used: int  # today's tokens (after our reservation, when admitted)


class _Backend(Protocol):
    async def reserve(
        self, user_id: int, slot_id: str, *, cap: int, tokens: int, quota: int, day: str
    ) -> _Verdict: ...
    async def refresh(self, user_id: int, slot_id: str) -> bool: ...
    async def release(self, user_id: int, slot_id: str, *, day: str, delta: int) -> None: ...
    async def tokens_used(self, user_id: int, day: str) -> int: ...
    async def reset_tokens(self, user_id: int, day: str) -> None: ...
    async def close(self) -> None: ...


# Slots: a sorted set of slot ids scored by lease expiry (ms, Redis's clock, so instances'
# clock skew cannot expire each other's slots early). Tokens: a per-user per-UTC-day counter.
# Both keys of a user share a hash tag, so one script may touch both on a Redis Cluster.
_RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, quota, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local streams = redis.call('ZCARD', KEYS[1])
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
if streams >= cap then return {1, streams, used} end
if quota > 0 and used + tokens > quota then return {2, streams, used} end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease + 1000)
used = redis.call('INCRBY', KEYS[2], tokens)
redis.call('EXPIRE', KEYS[2], ttl)
return {0, streams + 1, used}
"""

_REFRESH_LUA = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease + 1000)
return 1
"""

_RELEASE_LUA = """
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local delta = tonumber(ARGV[2])
if delta ~= 0 then
  -- A refund after an admin reset must not leave the day below zero.
  if redis.call('INCRBY', KEYS[2], delta) < 0 then redis.call('SET', KEYS[2], 0) end
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return 1
"""


class _RedisBackend:
    def __init__(self, client: aioredis.Redis, prefix: str, lease_seconds: float) -> None:
        self._client = client
        self._prefix = prefix
        self._lease_ms = max(1, int(lease_seconds * 1000))
        self._reserve = client.register_script(_RESERVE_LUA)
        self._refresh = client.register_script(_REFRESH_LUA)
        self._release = client.register_script(_RELEASE_LUA)

    def _slots_key(self, user_id: int) -> str:
        return f"{self._prefix}{{u:{user_id}}}:streams"

    def _tokens_key(self, user_id: int, day: str) -> str:
        return f"{self._prefix}{{u:{user_id}}}:tokens:{day}"

    async def reserve(
        self, user_id: int, slot_id: str, *, cap: int, tokens: int, quota: int, day: str
    ) -> _Verdict:
        code, streams, used = await self._reserve(
            keys=[self._slots_key(user_id), self._tokens_key(user_id, day)],
            args=[slot_id, self._lease_ms, cap, tokens, quota, TOKEN_KEY_TTL_SECONDS],
        )
        status: Literal["ok", "streams", "tokens"] = ("ok", "streams", "tokens")[int(code)]
        return _Verdict(status, int(streams), int(used))

    async def refresh(self, user_id: int, slot_id: str) -> bool:
        held = await self._refresh(keys=[self._slots_key(user_id)], args=[slot_id, self._lease_ms])
        return bool(held)

    async def release(self, user_id: int, slot_id: str, *, day: str, delta: int) -> None:
        await self._release(
            keys=[self._slots_key(user_id), self._tokens_key(user_id, day)],
            args=[slot_id, delta, TOKEN_KEY_TTL_SECONDS],
        )

    async def tokens_used(self, user_id: int, day: str) -> int:
        return max(0, int(await self._client.get(self._tokens_key(user_id, day)) or 0))

    async def reset_tokens(self, user_id: int, day: str) -> None:
        await self._client.delete(self._tokens_key(user_id, day))

    async def close(self) -> None:
        await self._client.aclose()


class _MemoryBackend:
    """The same semantics inside one process: for `make run` without Redis, and the tests."""

    def __init__(self, lease_seconds: float) -> None:
        self._lease = lease_seconds
        self._lock = asyncio.Lock()
        self._slots: dict[int, dict[str, float]] = {}  # user → slot → expiry (monotonic)
        self._tokens: dict[tuple[int, str], int] = {}  # (user, UTC day) → tokens
        self._pruned_day = ""

    def _live_slots(self, user_id: int, now: float) -> dict[str, float]:
        slots = {s: exp for s, exp in self._slots.get(user_id, {}).items() if exp > now}
        self._slots[user_id] = slots
        return slots

    async def reserve(
        self, user_id: int, slot_id: str, *, cap: int, tokens: int, quota: int, day: str
    ) -> _Verdict:
        async with self._lock:
            if day != self._pruned_day:
                # A new day: yesterday stays for late settles, older days go (like the TTL).
                yesterday = (datetime.strptime(day, "%Y-%m-%d") - timedelta(days=1)).strftime(
                    "%Y-%m-%d"
                )
                self._tokens = {k: v for k, v in self._tokens.items() if k[1] >= yesterday}
                self._slots = {u: s for u, s in self._slots.items() if s}
                self._pruned_day = day
            slots = self._live_slots(user_id, time.monotonic())
            used = self._tokens.get((user_id, day), 0)
            if len(slots) >= cap:
                return _Verdict("streams", len(slots), used)
            if quota > 0 and used + tokens > quota:
                return _Verdict("tokens", len(slots), used)
            slots[slot_id] = time.monotonic() + self._lease
            self._tokens[(user_id, day)] = used + tokens
            return _Verdict("ok", len(slots), used + tokens)

    async def refresh(self, user_id: int, slot_id: str) -> bool:
        async with self._lock:
            slots = self._live_slots(user_id, time.monotonic())
            if slot_id not in slots:
                return False
            slots[slot_id] = time.monotonic() + self._lease
            return True

    async def release(self, user_id: int, slot_id: str, *, day: str, delta: int) -> None:
        async with self._lock:
            self._slots.get(user_id, {}).pop(slot_id, None)
            if delta:
                key = (user_id, day)
                self._tokens[key] = max(0, self._tokens.get(key, 0) + delta)

    async def tokens_used(self, user_id: int, day: str) -> int:
        return self._tokens.get((user_id, day), 0)

    async def reset_tokens(self, user_id: int, day: str) -> None:
        async with self._lock:
            self._tokens.pop((user_id, day), None)

    async def close(self) -> None:
        return None


# --- the limiter ---------------------------------------------------------------------------


class Admission:
    """What an admitted prompt holds until its turn ends: a stream slot and reserved tokens.

    The turn calls `refresh()` every `refresh_interval` seconds and `settle()` exactly when it
    ends (settling twice is harmless). A turn that dies without settling loses its slot when
    the lease runs out; its reservation stays charged (the safe side of a quota).
    """

    def __init__(
        self,
        limiter: Limiter,
        user_id: int,
        *,
        reserved: int,
        slot_id: str,
        day: str,
        limits: UserLimits,
        degraded: bool = False,
    ) -> None:
        self.user_id = user_id
        self.reserved = reserved
        self.slot_id = slot_id
        self.day = day
        self.limits = limits
        # Admitted while the storage was down ("open" policy): nothing to refresh or settle.
        self.degraded = degraded
        self._limiter = limiter
        self._settled = False

    def __repr__(self) -> str:
        return (
            f"<Admission user={self.user_id} reserved={self.reserved} slot={self.slot_id}"
            f"{' degraded' if self.degraded else ''}{' settled' if self._settled else ''}>"
        )

    @property
    def settled(self) -> bool:
        return self._settled

    @property
    def refresh_interval(self) -> float:
        """A third of the lease: two refreshes may be lost before the slot expires."""
        return self._limiter.lease_seconds / 3

    async def refresh(self) -> None:
        """Extend the stream slot's lease; the turn calls this while it streams."""
        if self._settled or self.degraded:
            return
        try:
            held = await self._limiter._backend.refresh(self.user_id, self.slot_id)
        except _STORAGE_ERRORS as exc:
            self._limiter._note_failure("refresh", exc)
            return
        if not held:
            # The lease ran out (a long pause, a Redis failover); the turn goes on, but the
            # slot is not recreated: that could push the user over the cap.
            logger.info("stream slot %s of user %s had expired", self.slot_id, self.user_id)

    async def settle(self, used_tokens: int | None) -> None:
        """Free the slot and reconcile: refund the unused reservation, or charge the excess.

        `used_tokens` None or 0 means the turn failed and delivered nothing: refund it all.
        """
        if self._settled:
            return
        # Mark first: a second settle racing this one (stop + the turn's own finally) must
        # not refund twice.
        self._settled = True
        if self.degraded:
            return
        delta = (used_tokens - self.reserved) if used_tokens else -self.reserved
        try:
            await self._limiter._backend.release(
                self.user_id, self.slot_id, day=self.day, delta=delta
            )
        except _STORAGE_ERRORS as exc:
            # The slot will expire with its lease; the reservation stays charged.
            self._limiter._note_failure("settle", exc)


LimitsResolver = Callable[[int], Awaitable[UserLimits]]


def _limits_storage_uri(redis_url: str) -> str:
    # The limits library picks its async storages by scheme: `async+redis://`, not `redis://`.
    if redis_url.startswith("unix://"):
        return "async+redis+unix://" + redis_url.removeprefix("unix://")
    return "async+" + redis_url


class Limiter:
    """Admits chat prompts (rate, stream slot, token reservation) and HTTP requests (rate)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        prefix: str | None = None,
        failure: Literal["open", "closed"] | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        limits_resolver: LimitsResolver | None = None,
        socket_timeout: float = 1.0,
    ) -> None:
        """Defaults come from settings; tests pass their own prefix, URL, lease or limits."""
        url = settings.REDIS_URL if redis_url is None else redis_url
        self.prefix = getattr(settings, "CHAT_REDIS_PREFIX", "chat:") if prefix is None else prefix
        self.failure = settings.CHAT_LIMITER_FAILURE if failure is None else failure
        self.lease_seconds = lease_seconds
        self.backend_name = "redis" if url else "memory"
        self._resolve = limits_resolver or limits_for
        self._backend: _Backend
        self._storage: RedisStorage | MemoryStorage
        if url:
            client = aioredis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                # redis-py retries 10 times with backoff by default: seconds per prompt while
                # Redis is down. One immediate retry covers a stale pooled connection.
                retry=Retry(NoBackoff(), 1),
            )
            self._storage = RedisStorage(
                _limits_storage_uri(url),
                implementation="redispy",
                key_prefix=f"{self.prefix}rate",
                # One pool for the whole limiter (limits' stubs type **options too narrowly).
                connection_pool=client.connection_pool,  # type: ignore[arg-type]
            )
            self._backend = _RedisBackend(client, self.prefix, lease_seconds)
        else:
            self._storage = MemoryStorage()
            self._backend = _MemoryBackend(lease_seconds)
        # Moving window: exact ("at most N in any N-second span") and it yields the exact
        # moment a slot frees for retry_after. Why not the sliding-window counter: the doc.
        self._window = MovingWindowRateLimiter(self._storage)

    def __repr__(self) -> str:
        return f"<Limiter {self.backend_name} prefix={self.prefix!r} failure={self.failure}>"

    async def aclose(self) -> None:
        """Close the Redis connections (tests, shutdown)."""
        await self._backend.close()

    # -- public API ---------------------------------------------------------------------------

    async def admit(
        self, user_id: int, *, estimate_tokens: int, limits: UserLimits | None = None
    ) -> Admission | Rejection:
        """Admit one prompt, or say why not. The caller must `settle()` what it gets."""
        if limits is None:
            limits = await self._resolve(user_id)
        now = time.time()
        day = _utc_day(now)
        quota = max(0, limits.daily_tokens)
        # A prompt is never refused just because its estimate exceeds the whole quota: then
        # it needs the whole day unused, and reconciliation charges what it really used.
        tokens = max(0, estimate_tokens)
        if quota:
            tokens = min(tokens, quota)
        slot_id = uuid.uuid4().hex
        try:
            rejected = await self._hit_rate(("chat", str(user_id)), limits.rate, "message")
            if rejected:
                return rejected
            # Slot and reservation in one atomic step: nothing to undo between them. The rate
            # hit above stays counted when they refuse (see the decision doc).
            verdict = await self._backend.reserve(
                user_id,
                slot_id,
                cap=max(0, limits.max_streams),
                tokens=tokens,
                quota=quota,
                day=day,
            )
        except _STORAGE_ERRORS as exc:
            self._note_failure("admit", exc)
            if self.failure == "closed":
                return self._unavailable()
            return Admission(
                self, user_id, reserved=0, slot_id="", day=day, limits=limits, degraded=True
            )
        if verdict.status == "streams":
            return self._streams_rejection(limits.max_streams)
        if verdict.status == "tokens":
            return self._tokens_rejection(quota, verdict.used, tokens)
        return Admission(self, user_id, reserved=tokens, slot_id=slot_id, day=day, limits=limits)

    async def hit_http(self, key: str, rate: str) -> Rejection | None:
        """Count one HTTP request against `rate` for `key` (a user or a client address)."""
        try:
            return await self._hit_rate(("http", key), rate, "request")
        except _STORAGE_ERRORS as exc:
            self._note_failure("hit_http", exc)
            return self._unavailable() if self.failure == "closed" else None

    async def tokens_today(self, user_id: int) -> tuple[int, int]:
        """(tokens used or reserved today, the daily quota; 0 = unlimited) for the usage meter."""
        limits = await self._resolve(user_id)
        try:
            used = await self._backend.tokens_used(user_id, _utc_day(time.time()))
        except _STORAGE_ERRORS as exc:
            self._note_failure("tokens_today", exc)
            used = 0
        return used, max(0, limits.daily_tokens)

    async def reset_today(self, user_id: int) -> None:
        """Forget today's token count for the user (an admin's bulk action)."""
        try:
            await self._backend.reset_tokens(user_id, _utc_day(time.time()))
        except _STORAGE_ERRORS as exc:
            self._note_failure("reset_today", exc)

    # -- steps ----------------------------------------------------------------------------------

    async def _hit_rate(
        self, identifiers: tuple[str, ...], rate: str, noun: str
    ) -> Rejection | None:
        for item in _parse_rate(rate):
            if await self._window.hit(item, *identifiers):
                continue
            stats = await self._window.get_window_stats(item, *identifiers)
            now = time.time()
            # The window may have moved on between the hit and the stats: then it is free now.
            reset_at = stats.reset_time if stats.remaining <= 0 else now + 1
            retry_after = max(1, math.ceil(reset_at - now))
            return Rejection(
                code="rate_limited",
                message=(
                    f"You can send {describe_rate(item, noun)}. "
                    f"Try again in {human_duration(retry_after)}."
                ),
                retry_after=retry_after,
                reset_at=max(reset_at, now + 1),
            )
        return None

    def _streams_rejection(self, cap: int) -> Rejection:
        if cap <= 0:
            message = "Your plan does not allow answers to stream right now."
        elif cap == 1:
            message = "You already have an answer streaming; wait for it to finish or stop it."
        else:
            message = (
                f"You already have {cap} answers streaming; wait for one to finish or stop it."
            )
        return Rejection(
            code="too_many_streams",
            message=message,
            retry_after=STREAMS_RETRY_AFTER,
            reset_at=time.time() + STREAMS_RETRY_AFTER,
        )

    def _tokens_rejection(self, quota: int, used: int, needed: int) -> Rejection:
        now = time.time()
        reset_at = _next_utc_midnight(now)
        retry_after = max(1, math.ceil(reset_at - now))
        resets = f"The quota resets at 00:00 UTC (in {human_duration(retry_after)})."
        if used >= quota:
            said = f"You have used today's {quota:,} tokens."
        else:
            said = (
                f"This message may need up to {needed:,} tokens and only {quota - used:,} "
                f"of today's {quota:,} are left."
            )
        return Rejection(
            code="quota_exceeded",
            message=f"{said} {resets}",
            retry_after=retry_after,
            reset_at=reset_at,
        )

    def _unavailable(self) -> Rejection:
        return Rejection(
            code="rate_limited",
            message=(
                "Usage limits are temporarily unavailable, so new messages are paused. "
                f"Try again in {human_duration(UNAVAILABLE_RETRY_AFTER)}."
            ),
            retry_after=UNAVAILABLE_RETRY_AFTER,
            reset_at=time.time() + UNAVAILABLE_RETRY_AFTER,
        )

    def _note_failure(self, operation: str, exc: BaseException) -> None:
        limiter_failures[operation] = limiter_failures.get(operation, 0) + 1
        logger.warning(
            "limiter storage unavailable during %s (%s: %s); failing %s",
            operation,
            type(exc).__name__,
            exc,
            self.failure,
        )


# --- one limiter per event loop ------------------------------------------------------------

# redis-py's asyncio connections belong to the loop that opened them, and tests run many loops.
_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Limiter] = (
    weakref.WeakKeyDictionary()
)


def get_limiter() -> Limiter:
    """This process's limiter for the running event loop, configured from settings."""
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        limiter = _limiters[loop] = Limiter()
    return limiter


async def close_limiter() -> None:
    """Close and forget the running loop's limiter (shutdown, test teardown)."""
    limiter = _limiters.pop(asyncio.get_running_loop(), None)
    if limiter is not None:
        await limiter.aclose()


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting in {
        "REDIS_URL",
        "CHAT_REDIS_PREFIX",
        "CHAT_LIMITER_FAILURE",
        "CHAT_RATE_LIMIT",
        "CHAT_DAILY_TOKENS",
        "CHAT_MAX_CONCURRENT_STREAMS",
    }:
        _limiters.clear()
        forget_cached_limits()


setting_changed.connect(_on_setting_changed, dispatch_uid="ratelimit-settings")
