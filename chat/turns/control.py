"""Cross-instance control signals for turns: a stop request reaches the instance owning the turn."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from django.conf import settings
from redis.exceptions import RedisError

from chat.loops import PerLoop, cancel_and_wait
from chat.redis_clients import redis_client

logger = logging.getLogger(__name__)

# How long a stop request stays readable for an owner that missed the published message.
STOP_KEY_SECONDS = 60
# How long start() waits for the first subscription before letting the caller go on.
START_WAIT = 2.0
RECONNECT_BACKOFF_MIN = 0.05
RECONNECT_BACKOFF_MAX = 5.0

StopCallback = Callable[[str], None]


@dataclass
class ControlStats:
    """Process-wide counters of control-channel trouble, for metrics."""

    publish_errors: int = 0  # stop requests that could not be published at once (retried)
    subscriber_errors: int = 0  # subscriber connections lost (each is retried)
    callback_errors: int = 0  # stop callbacks that raised


stats = ControlStats()


class Control(ABC):
    """Stop requests for messages, delivered to the local callbacks of every instance."""

    def __init__(self) -> None:
        self._stop_callbacks: list[StopCallback] = []

    def on_stop(self, callback: StopCallback) -> None:
        """Call `callback(mid)` on this instance whenever a stop is requested anywhere."""
        self._stop_callbacks.append(callback)

    def _dispatch_stop(self, mid: str) -> None:
        for callback in list(self._stop_callbacks):
            try:
                callback(mid)
            except Exception:
                # One broken callback must not keep a stop from the others.
                stats.callback_errors += 1
                logger.exception("control: stop callback %r failed for %s", callback, mid)

    @abstractmethod
    async def request_stop(self, mid: str) -> None:
        """Ask whichever instance owns the turn of `mid` to stop it; never raises."""

    @abstractmethod
    async def stop_requested(self, mid: str) -> bool:
        """Whether a stop was requested for `mid` within the last STOP_KEY_SECONDS."""

    @abstractmethod
    async def start(self) -> None:
        """Start listening for other instances' requests (idempotent)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop listening and release connections."""


class MemoryControl(Control):
    """Control within one process (no REDIS_URL): every turn is local."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._requested: dict[str, float] = {}  # mid -> expiry

    async def request_stop(self, mid: str) -> None:
        now = self._clock()
        for old in [m for m, expires_at in self._requested.items() if expires_at <= now]:
            del self._requested[old]
        self._requested[mid] = now + STOP_KEY_SECONDS
        self._dispatch_stop(mid)

    async def stop_requested(self, mid: str) -> bool:
        expires_at = self._requested.get(mid)
        return expires_at is not None and expires_at > self._clock()

    async def start(self) -> None:
        return None  # nobody else to hear from

    async def aclose(self) -> None:
        self._requested.clear()


class RedisControl(Control):
    """Control across instances: Redis pub/sub for speed, a stop key for owners that missed it."""

    def __init__(
        self, redis_url: str, prefix: str = "chat:", *, start_wait: float = START_WAIT
    ) -> None:
        super().__init__()
        self._start_wait = start_wait
        self._prefix = prefix
        self._channel = f"{prefix}control"
        # Our own messages come back through the subscription; the local owner was already
        # told directly, so the subscriber skips messages carrying this token.
        self._token = uuid.uuid4().hex
        self._commands = redis_client(
            "control",
            url=redis_url,
            prefix=prefix,
            max_connections=16,
            pool_timeout=5.0,
            socket_timeout=5.0,
            retries=1,
        )
        # The subscription holds a connection of its own for as long as it lives; it
        # reconnects on its own schedule, so redis-py must not retry underneath it.
        self._subscriber = redis_client(
            "control-sub",
            url=redis_url,
            prefix=prefix,
            max_connections=1,
            pool_timeout=None,
            socket_timeout=5.0,
            retries=0,
        )
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._retries: set[asyncio.Task[None]] = set()  # stops waiting for Redis to publish

    def _stop_key(self, mid: str) -> str:
        return f"{self._prefix}stop:{mid}"

    async def request_stop(self, mid: str) -> None:
        # The local owner (if it is us) hears it at once, whatever Redis is doing.
        self._dispatch_stop(mid)
        try:
            await self._publish_stop(mid)
        except (RedisError, OSError) as exc:
            stats.publish_errors += 1
            logger.warning("control: stop of %s not published yet (%s); retrying", mid, exc)
            # Redis is away (restarting, failing over): keep trying for as long as a stop key
            # lives, so that an owner on another instance still hears it once Redis is back.
            retry = asyncio.get_running_loop().create_task(
                self._publish_later(mid), name=f"publish stop {mid}"
            )
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)

    async def _publish_stop(self, mid: str) -> None:
        message = json.dumps({"op": "stop", "mid": mid, "from": self._token})
        async with self._commands.pipeline(transaction=False) as pipe:
            # The key first: an owner woken by the message, or one that missed it and
            # checks at its next checkpoint, finds it set.
            pipe.set(self._stop_key(mid), "1", ex=STOP_KEY_SECONDS)
            pipe.publish(self._channel, message)
            await pipe.execute()

    async def _publish_later(self, mid: str) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + STOP_KEY_SECONDS
        backoff = RECONNECT_BACKOFF_MIN
        while loop.time() + backoff < give_up:
            await asyncio.sleep(backoff)
            try:
                await self._publish_stop(mid)
            except (RedisError, OSError):
                backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX)
                continue
            logger.warning("control: stop of %s published after all", mid)
            return
        logger.warning("control: stop of %s reached this instance only", mid)

    async def stop_requested(self, mid: str) -> bool:
        try:
            return bool(await self._commands.exists(self._stop_key(mid)))
        except (RedisError, OSError) as exc:
            logger.warning("control: cannot check the stop key of %s: %s", mid, exc)
            return False

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._listen_forever(), name="control-subscriber"
            )
        # Wait for the first subscription, so that a stop published right after start()
        # arrives; with Redis away, go on and let the task keep trying.
        try:
            await asyncio.wait_for(asyncio.shield(self._subscribed.wait()), self._start_wait)
        except TimeoutError:
            logger.warning("control: not subscribed yet; retrying in the background")

    async def _listen_forever(self) -> None:
        backoff = 0.0
        while True:
            pubsub = self._subscriber.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    # Blocks without a timeout; TCP keepalive (on by default in redis-py)
                    # turns a silently dead connection into an error.
                    message = await pubsub.get_message(timeout=None)
                    if message is None:
                        continue
                    if message["type"] == "message":
                        self._handle(message.get("data"))
                    elif message["type"] == "subscribe":
                        # Redis confirmed: from here on, every stop published reaches us.
                        self._subscribed.set()
                        if backoff:
                            logger.warning("control: subscribed again")
                        backoff = 0.0
            except (RedisError, OSError) as exc:
                self._subscribed.clear()
                stats.subscriber_errors += 1
                # Once per outage (a failover takes several attempts), then "subscribed again".
                level = logging.DEBUG if backoff else logging.WARNING
                logger.log(level, "control: subscription lost (%s); reconnecting", exc)
            finally:
                await pubsub.aclose()
            backoff = min(max(backoff * 2, RECONNECT_BACKOFF_MIN), RECONNECT_BACKOFF_MAX)
            await asyncio.sleep(backoff)

    def _handle(self, data: object) -> None:
        try:
            message = json.loads(data) if isinstance(data, str) else None
        except ValueError:
            message = None
        if not isinstance(message, dict):
            logger.warning("control: ignoring a malformed message %r", data)
            return
        if message.get("from") == self._token:
            return
        mid = message.get("mid")
        if message.get("op") == "stop" and isinstance(mid, str):
            self._dispatch_stop(mid)

    async def aclose(self) -> None:
        for retry in list(self._retries):
            await cancel_and_wait(retry)
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self._subscribed.clear()
        await self._subscriber.aclose()
        await self._commands.aclose()


# --- one per process and event loop ------------------------------------------------------------


def _config() -> Hashable:
    return (settings.REDIS_URL, settings.CHAT_REDIS_PREFIX)


def _build() -> Control:
    if settings.REDIS_URL:
        return RedisControl(settings.REDIS_URL, settings.CHAT_REDIS_PREFIX)
    return MemoryControl()


async def _close(control: Control) -> None:
    await control.aclose()


controls: PerLoop[Control] = PerLoop("control channel", _build, _close, config=_config)


def get_control() -> Control:
    """This process's control for the running event loop, chosen by REDIS_URL.

    Call `await get_control().start()` once the loop runs to hear other instances.
    """
    return controls.get()
