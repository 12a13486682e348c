"""Throttles on the account forms: login attempts per client address and per username (both
login forms, the site's and the admin's), signups per client address (issue 13.5, 13.14).

Each is a set of moving windows of the `limits` library, in Redis when `REDIS_URL` is set
(every instance shares them) and in this process otherwise: the same storage and strategy as
the chat's rate limits. Several windows of growing length make the backoff: with
`5/minute;10/15 minutes;30/day` the sixth try waits for the minute, the eleventh for the
quarter hour, the thirty-first for the day. docs/decisions/login-throttling.md says why.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
import unicodedata
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

import redis.asyncio as aioredis
from django.conf import settings
from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter

from chat import metrics
from chat.limits import refusals
from chat.limits.rates import human_duration, limits_storage_uri, parse_rate
from chat.limits.refusals import Rejection
from chat.loops import PerLoop
from chat.redis_clients import REDIS_DOWN, redis_client

logger = logging.getLogger(__name__)

Which = Literal["address", "username", "device", "signup", "reset"]


def address_key(address: str) -> str:
    """What a client address is counted as: itself for IPv4, its /64 for IPv6 (one subscriber
    gets a whole /64: counting single IPv6 addresses would give an attacker 2^64 of them)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def username_key(username: str) -> str:
    """What a typed username is counted as: NFKC and case-folded (so `Alice` and `ALİCE` count
    with `alice`), hashed (any length, any character, a fixed-size key)."""
    folded = unicodedata.normalize("NFKC", username).strip().casefold()
    return hashlib.sha256(folded.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass
class LoginAttempt:
    """An attempt the throttle let through. `windows` are the (rate, identifiers) counted
    against the username (or the trusted device): a successful login clears them."""

    username: str
    windows: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    succeeded: bool = False


class LoginThrottle:
    """Counts login attempts and signups; says when one is over its limit, and for how long."""

    def __init__(self, redis_url: str | None = None, *, prefix: str | None = None) -> None:
        url = settings.REDIS_URL if redis_url is None else redis_url
        self.prefix = settings.CHAT_REDIS_PREFIX if prefix is None else prefix
        self.failure = settings.CHAT_LIMITER_FAILURE
        self.backend_name = "redis" if url else "memory"
        self._storage: RedisStorage | MemoryStorage
        self._client: aioredis.Redis | None = None
        if url:
            client = redis_client(
                "logins",
                url=url,
                prefix=self.prefix,
                socket_timeout=1.0,
                connect_timeout=1.0,
                retries=1,
                decode_responses=False,
            )
            self._client = client
            self._storage = RedisStorage(
                limits_storage_uri(url),
                implementation="redispy",
                key_prefix=f"{self.prefix}auth",
                connection_pool=client.connection_pool,  # type: ignore[arg-type]
            )
        else:
            self._storage = MemoryStorage()
        self._window = MovingWindowRateLimiter(self._storage)

    def __repr__(self) -> str:
        return f"<LoginThrottle {self.backend_name} prefix={self.prefix!r}>"

    async def login(
        self, address: str, username: str, device: str | None = None
    ) -> LoginAttempt | Rejection:
        """Count one login attempt (before the password is checked, so that parallel attempts
        cannot all slip under the limit), or say why it is refused.

        `device`: the id of this browser's trusted-device cookie when it was given by a
        successful login as this very username; its attempts are counted apart from the
        username's, so that someone guessing a user's password elsewhere does not lock the
        user out of the browser they always log in from.
        """
        attempt = LoginAttempt(username)
        user = ("device", device) if device else ("user", username_key(username))
        steps: list[tuple[Which, str, tuple[str, ...]]] = [
            ("address", settings.CHAT_LOGIN_RATE_PER_ADDRESS, ("addr", address_key(address))),
            ("device" if device else "username", settings.CHAT_LOGIN_RATE_PER_USERNAME, user),
        ]
        for which, rate, identifiers in steps:
            rejection = await self._hit(("login", *identifiers), rate, which)
            if rejection is not None:
                return rejection
            if which != "address":
                attempt.windows.append((rate, ("login", *identifiers)))
        return attempt

    async def succeeded(self, attempt: LoginAttempt) -> None:
        """A login succeeded: the username's (or the device's) failures are forgotten. Never
        the address's: an attacker with an account of their own could otherwise reset their
        address's count between guesses at someone else's password."""
        attempt.succeeded = True
        try:
            for rate, identifiers in attempt.windows:
                for item in parse_rate(rate):
                    await self._window.clear(item, *identifiers)
        except REDIS_DOWN as exc:
            self._note_failure("login_clear", exc)

    async def signup(self, address: str) -> Rejection | None:
        """Count one account created from `address`, or say why not."""
        return await self._hit(
            ("signup", address_key(address)), settings.CHAT_SIGNUP_RATE_PER_ADDRESS, "signup"
        )

    async def password_reset(self, email: str) -> Rejection | None:
        """Count one reset mail to `email` (any account, existing or not), or say why not."""
        return await self._hit(
            ("reset", username_key(email)), settings.CHAT_PASSWORD_RESET_RATE_PER_EMAIL, "reset"
        )

    async def _hit(self, identifiers: tuple[str, ...], rate: str, which: Which) -> Rejection | None:
        try:
            for item in parse_rate(rate):
                if await self._window.hit(item, *identifiers):
                    continue
                stats = await self._window.get_window_stats(item, *identifiers)
                metrics.rejected(
                    "rate_limited", which if which in ("signup", "reset") else f"login_{which}"
                )
                return refused(item, which, stats.reset_time)
        except REDIS_DOWN as exc:
            self._note_failure(f"{which}_hit", exc)
            return refusals.unavailable() if self.failure == "closed" else None
        return None

    def _note_failure(self, operation: str, exc: BaseException) -> None:
        metrics.limiter_failed(operation)
        logger.warning(
            "login throttle storage unavailable during %s (%s: %s); failing %s",
            operation,
            type(exc).__name__,
            exc,
            self.failure,
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def refused(item: RateLimitItem, which: Which, reset_time: float) -> Rejection:
    """The refusal, in words: what is limited and exactly how long to wait."""
    now = time.time()
    retry_after = max(1, math.ceil(reset_time - now))
    wait = human_duration(retry_after)
    if which == "signup":
        said = (
            "Too many accounts were created from your network address. "
            f"You can create another in {wait}."
        )
    elif which == "reset":
        said = f"Too many reset mails were asked for this address. Try again in {wait}."
    elif which == "address":
        said = f"Too many login attempts from your network address. Try again in {wait}."
    else:
        said = (
            "Too many login attempts for this username. For your account's safety, logging "
            f"in as this user is paused: try again in {wait}."
        )
    return Rejection(
        code="rate_limited", message=said, retry_after=retry_after, reset_at=now + retry_after
    )


def _config() -> Hashable:
    return (
        settings.REDIS_URL,
        settings.CHAT_REDIS_PREFIX,
        settings.CHAT_LIMITER_FAILURE,
    )


async def _close(throttle: LoginThrottle) -> None:
    await throttle.aclose()


login_throttles: PerLoop[LoginThrottle] = PerLoop(
    "login throttle", LoginThrottle, _close, config=_config
)


def get_login_throttle() -> LoginThrottle:
    """This process's throttle of the account forms for the running event loop."""
    return login_throttles.get()
