"""Per-user limits on chat turns: the request rate, the daily token quota, concurrent streams.

One core for two thin adapters (the socket's ASGI middleware, the HTTP middleware). Counting
lives in Redis when `REDIS_URL` is set, so every instance shares it, and in this process's
memory otherwise. The design and its numbers: docs/decisions/rate-limiting.md.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Literal

from django.conf import settings
from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter

from chat import metrics
from chat.limits import refusals
from chat.limits.admission import Admission as Admission  # where callers find it
from chat.limits.admission import usable_left
from chat.limits.plans import UserLimits, limits_for
from chat.limits.rates import limits_storage_uri, parse_rate, utc_day
from chat.limits.refusals import Rejection
from chat.limits.storage import (
    Backend,
    Budgets,
    MemoryBackend,
    Pool,
    RedisBackend,
    Reservation,
    Settled,
)
from chat.loops import PerLoop
from chat.redis_clients import REDIS_DOWN, redis_client

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30.0


# --- the rate windows in this process's memory (no REDIS_URL) -------------------------------

# How often, at most, the windows kept in memory drop their expired hits (memory only: every
# check reads the hits' times itself, so when they are dropped changes no verdict).
MEMORY_EXPIRY_SECONDS = 1.0


class LoopMemoryStorage(MemoryStorage):
    """limits' MemoryStorage, with its clean-up of expired hits done on the loop.

    limits (5.8) starts its clean-up after any hit once the previous one ended, and there hands
    each key's `bisect` to a worker thread (`asyncio.to_thread`): in a burst of 200 new users,
    400 thread hops for 200 admissions, each a wake-up of the loop and a fight for the GIL, for
    a search of at most a window's few hits (docs/decisions/performance.md, thread hops). Here
    the search runs on the loop, yielding every few hundred keys, at most once a second.
    """

    _next_expiry = 0.0

    async def _MemoryStorage__schedule_expiry(self) -> None:
        now = time.monotonic()
        if (self.timer is None or self.timer.done()) and now >= self._next_expiry:
            self._next_expiry = now + MEMORY_EXPIRY_SECONDS
            self.timer = asyncio.create_task(self._expire_on_loop())

    async def _expire_on_loop(self) -> None:
        now = time.time()
        for index, key in enumerate(list(self.events)):
            if index and not index % 256:
                await asyncio.sleep(0)  # a process with many users' windows: others go first
            async with self.locks[key]:
                events = self.events.get(key, [])
                cutoff = bisect.bisect_left(events, -now, key=lambda event: -event.expiry)
                if events:
                    self.events[key] = events[:cutoff]
                if not self.events.get(key):
                    self.events.pop(key, None)
                    self.locks.pop(key, None)
        for key in list(self.expirations):
            if self.expirations[key] <= time.time():
                self.storage.pop(key, None)
                self.expirations.pop(key, None)
                self.locks.pop(key, None)


# --- the limiter ---------------------------------------------------------------------------


LimitsResolver = Callable[[int], Awaitable[UserLimits]]


def _budgets(limits: UserLimits) -> Budgets:
    return Budgets(max(0, limits.daily_tokens), max(0, settings.CHAT_GLOBAL_DAILY_TOKENS))


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
        self.prefix = settings.CHAT_REDIS_PREFIX if prefix is None else prefix
        self.failure = settings.CHAT_LIMITER_FAILURE if failure is None else failure
        self.lease_seconds = lease_seconds
        self.backend_name = "redis" if url else "memory"
        self._resolve = limits_resolver or limits_for
        self._backend: Backend
        self._storage: RedisStorage | MemoryStorage
        if url:
            # redis-py retries 10 times with backoff by default: seconds per prompt while Redis
            # is down. One immediate retry covers a stale pooled connection.
            client = redis_client(
                "limiter",
                url=url,
                prefix=self.prefix,
                socket_timeout=socket_timeout,
                connect_timeout=socket_timeout,
                retries=1,
                decode_responses=False,
            )
            self._storage = RedisStorage(
                limits_storage_uri(url),
                implementation="redispy",
                key_prefix=f"{self.prefix}rate",
                # One pool for the whole limiter (limits' stubs type **options too narrowly).
                connection_pool=client.connection_pool,  # type: ignore[arg-type]
            )
            self._backend = RedisBackend(client, self.prefix, lease_seconds)
        else:
            self._storage = LoopMemoryStorage()
            self._backend = MemoryBackend(lease_seconds)
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
        self,
        user_id: int,
        *,
        estimate_tokens: int,
        at_least: int | None = None,
        limits: UserLimits | None = None,
        pool: Pool = "streams",
    ) -> Admission | Rejection:
        """Admit one turn, or say why not. The caller must `settle()` what it gets.

        The reservation is `estimate_tokens`, or what is left of the budgets if that is less,
        but at least `at_least` (default: all of the estimate), else the turn is refused.
        `pool="titles"` (a conversation's title, asked for in the background): refused when
        the user is at their rate limit, but not counted as one of their messages; its slot is
        taken from a set of its own, with the same cap as the user's streams, so a title never
        takes the slot the user's next prompt needs and a user's titles in flight stay bounded.
        """
        if limits is None:
            limits = await self._resolve(user_id)
        now = time.time()
        day = utc_day(now)
        budgets = _budgets(limits)
        want = max(0, estimate_tokens)
        floor = want if at_least is None else min(want, max(0, at_least))
        # A turn is never refused just because it asks for more than a whole budget: then it
        # needs the whole day unused (its answer is capped by what it gets).
        for budget in budgets:
            if budget:
                floor = min(floor, budget)
        slot_id = uuid.uuid4().hex
        try:
            rejected = await self._hit_rate(
                ("chat", str(user_id)), limits.rate, "message", count=pool == "streams"
            )
            if rejected:
                return rejected
            # Slot and reservation in one atomic step: nothing to undo between them. The rate
            # hit above stays counted when they refuse (see the decision doc).
            ask = Reservation(max(0, limits.max_streams), want, floor, budgets, day, pool)
            verdict = await self._backend.reserve(user_id, slot_id, ask)
        except REDIS_DOWN as exc:
            self._note_failure("admit", exc)
            if self.failure == "closed":
                return refusals.unavailable()
            return Admission(
                self, user_id, reserved=0, slot_id="", day=day, limits=limits, degraded=True
            )
        if verdict.status == "streams":
            return refusals.streams(limits.max_streams)
        if verdict.status == "tokens":
            return refusals.tokens(budgets.quota, verdict.granted, floor)
        if verdict.status == "budget":
            return refusals.budget()
        return Admission(
            self,
            user_id,
            reserved=verdict.granted,
            slot_id=slot_id,
            day=day,
            limits=limits,
            budgets=budgets,
            pool=pool,
        )

    async def hit_http(self, key: str, rate: str) -> Rejection | None:
        """Count one HTTP request against `rate` for `key` (a user or a client address)."""
        return await self._hit_named("hit_http", ("http", key), rate, "request")

    async def hit_page(self, key: str) -> Rejection | None:
        """Count one load of a page that sends a whole conversation (its stored HTML, over a
        megabyte for a long answer) against CHAT_PAGE_RATE for `key` (a user or an address):
        such GETs in a loop must not slow every other user's answers (docs/security.md)."""
        return await self._hit_named(
            "hit_page", ("page", key), settings.CHAT_PAGE_RATE, "page load", refuse=refusals.pages
        )

    async def hit_resume(self, user_id: int) -> Rejection | None:
        """Count one `resume` against CHAT_RESUME_RATE: sending a finished answer again costs
        its whole HTML (issue 13.6), following a streaming one replays every block so far
        (the resume storm, docs/security.md): a loop of them must not stall the instance.
        Never refused for an outage: a resume is how a tab gets back what it missed."""
        return await self._hit_named(
            "hit_resume",
            ("resume", str(user_id)),
            settings.CHAT_RESUME_RATE,
            "answer reload",
            refuse=refusals.resumes,
            fail_open=True,
        )

    async def hit_socket(self, user_id: int) -> Rejection | None:
        """Count one socket handshake against CHAT_SOCKET_RATE: tabs reconnecting in a loop
        (each a session check, a group to join, a `ready`, and the resumes after it) must not
        slow every other user's answers (the resume storm, docs/security.md). As the socket
        caps: a tab is not refused because Redis is away."""
        return await self._hit_named(
            "hit_socket",
            ("socket", str(user_id)),
            settings.CHAT_SOCKET_RATE,
            "connection",
            refuse=refusals.reconnects,
            fail_open=True,
        )

    async def hit_stranger(self, address: str, *, count: bool = True) -> Rejection | None:
        """A handshake from `address` that carried a session cookie but no valid session,
        against CHAT_STRANGER_SOCKET_RATE (`count=False`: only whether the address is over).
        Each costs a session lookup on the ORM thread before the consumer refuses it; a loop
        of them slowed every other user's first token (docs/security.md). Never refused for
        an outage (the consumer refuses strangers anyway)."""
        return await self._hit_named(
            "hit_stranger",
            ("stranger", address),
            settings.CHAT_STRANGER_SOCKET_RATE,
            "connection without a session",
            count=count,
            fail_open=True,
        )

    async def _hit_named(
        self,
        operation: str,
        identifiers: tuple[str, ...],
        rate: str,
        noun: str,
        *,
        refuse: Callable[[RateLimitItem, str, float, int], Rejection] = refusals.rate,
        count: bool = True,
        fail_open: bool = False,
    ) -> Rejection | None:
        """One of the rates above; over an outage of the storage `fail_open` lets it pass,
        else CHAT_LIMITER_FAILURE decides."""
        try:
            return await self._hit_rate(identifiers, rate, noun, count=count, refuse=refuse)
        except REDIS_DOWN as exc:
            self._note_failure(operation, exc)
            if fail_open or self.failure != "closed":
                return None
            return refusals.unavailable()

    async def tokens_today(self, user_id: int) -> tuple[int, int]:
        """(tokens counted against the user today, the daily quota; 0 = unlimited)."""
        limits = await self._resolve(user_id)
        try:
            used, _ = await self._backend.tokens_used(user_id, utc_day(time.time()))
        except REDIS_DOWN as exc:
            self._note_failure("tokens_today", exc)
            used = 0
        return used, max(0, limits.daily_tokens)

    async def release_dead(
        self, user_id: int, record: dict[str, Any], used_tokens: int | None
    ) -> None:
        """Settle the admission of a turn whose process died (its `record()`, kept with the
        answer): free its stream slot now rather than when its lease runs out, and charge
        `used_tokens` (None or 0: nothing delivered) instead of what it held.

        What it held is read by its slot from the shared count, not from the record: the
        turn may have resized its reservation since. Settling is exactly once, whoever does
        it: a turn that settled (or was released) before leaves nothing to release.
        Only shared (Redis) counts outlive a process: without Redis the dead turn's counts
        died with it, and there is nothing to release.
        """
        if self.backend_name == "memory":
            return
        try:
            slot, day = str(record["slot"]), str(record["day"])
            limits = await self._resolve(user_id)
            await self._backend.release(
                user_id,
                slot,
                day=day,
                spent=max(0, used_tokens or 0),
                budgets=_budgets(limits),
            )
        except REDIS_DOWN as exc:
            self._note_failure("release_dead", exc)
        except (KeyError, TypeError, ValueError):
            logger.warning("cannot release a dead turn's admission from %r", record)

    async def usable_today(self, user_id: int) -> int | None:
        """What the usage meter shows: the tokens the user can still spend today under their
        quota and the site's budget (0 when too few for a turn); None when neither applies."""
        limits = await self._resolve(user_id)
        budgets = _budgets(limits)
        if not any(budgets):
            return None
        try:
            counted = await self._backend.tokens_used(user_id, utc_day(time.time()))
        except REDIS_DOWN as exc:
            self._note_failure("tokens_today", exc)
            counted = (0, 0)
        return usable_left(budgets, Settled(*counted))

    async def reset_today(self, user_id: int) -> int | None:
        """Forgive today's tokens counted against the user (an admin's bulk action): the count
        and the Usage history stay; an allowance of the same size is recorded beside them.
        Returns the tokens forgiven, or None when the storage could not be reached."""
        try:
            return await self._backend.forgive(user_id, utc_day(time.time()))
        except REDIS_DOWN as exc:
            self._note_failure("reset_today", exc)
            return None

    # -- steps ----------------------------------------------------------------------------------

    async def _hit_rate(
        self,
        identifiers: tuple[str, ...],
        rate: str,
        noun: str,
        *,
        count: bool = True,
        refuse: Callable[[RateLimitItem, str, float, int], Rejection] = refusals.rate,
    ) -> Rejection | None:
        for item in parse_rate(rate):
            if count and await self._window.hit(item, *identifiers):
                continue
            if not count and await self._window.test(item, *identifiers):
                continue
            stats = await self._window.get_window_stats(item, *identifiers)
            return refuse(item, noun, stats.reset_time, stats.remaining)
        return None

    def _note_failure(self, operation: str, exc: BaseException) -> None:
        metrics.limiter_failed(operation)
        logger.warning(
            "limiter storage unavailable during %s (%s: %s); failing %s",
            operation,
            type(exc).__name__,
            exc,
            self.failure,
        )


# --- one limiter per event loop ------------------------------------------------------------


def _config() -> Hashable:
    return (
        settings.REDIS_URL,
        settings.CHAT_REDIS_PREFIX,
        settings.CHAT_LIMITER_FAILURE,
        settings.CHAT_RATE_LIMIT,
        settings.CHAT_DAILY_TOKENS,
        settings.CHAT_MAX_CONCURRENT_STREAMS,
        settings.CHAT_RESUME_RATE,
        settings.CHAT_SOCKET_RATE,
        settings.CHAT_PAGE_RATE,
        settings.CHAT_STRANGER_SOCKET_RATE,
        settings.CHAT_GLOBAL_DAILY_TOKENS,
    )


async def _close(limiter: Limiter) -> None:
    await limiter.aclose()


limiters: PerLoop[Limiter] = PerLoop("limiter", Limiter, _close, config=_config)


def get_limiter() -> Limiter:
    """This process's limiter for the running event loop, configured from settings."""
    return limiters.get()
