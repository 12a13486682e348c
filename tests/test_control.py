"""Control signals: a stop request reaches the instance that owns the turn, wherever it runs."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from chat.turns import control as control_module
from chat.turns.control import (
    STOP_KEY_SECONDS,
    Control,
    MemoryControl,
    RedisControl,
    get_control,
)
from chat.turns.control import controls as loop_controls

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
UNREACHABLE_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1: a real refusal


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key and channel prefix of this test's own; its keys are deleted afterwards."""
    prefix = f"test-control-{uuid.uuid4().hex[:10]}:"
    yield prefix
    with redis.Redis.from_url(REDIS_URL) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
async def controls(prefix: str) -> AsyncIterator[list[RedisControl]]:
    """Two Redis controls with their own connections: two instances of the site."""
    made = [RedisControl(REDIS_URL, prefix), RedisControl(REDIS_URL, prefix)]
    yield made
    for control in made:
        await control.aclose()


class Recorder:
    """A stop callback that remembers what it was told."""

    def __init__(self) -> None:
        self.mids: list[str] = []
        self.arrived = asyncio.Event()

    def __call__(self, mid: str) -> None:
        self.mids.append(mid)
        self.arrived.set()

    async def wait_for(self, mid: str) -> None:
        async with asyncio.timeout(10):
            while mid not in self.mids:
                self.arrived.clear()
                await self.arrived.wait()


def subscribers(prefix: str) -> int:
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as client:
        return int(dict(client.pubsub_numsub(f"{prefix}control"))[f"{prefix}control"])


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll until condition holds; a bound on a wait, not an assertion on speed."""
    async with asyncio.timeout(timeout):
        # The condition is Redis's view (CLIENT LIST, PUBSUB NUMSUB): no event to wait on.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert condition(), what


@pytest.mark.redis
async def test_a_stop_requested_on_one_instance_reaches_the_callback_on_another(
    controls: list[RedisControl],
) -> None:
    asker, owner = controls
    heard = Recorder()
    owner.on_stop(heard)
    await owner.start()

    await asker.request_stop("1764428000123-web1-03")

    await heard.wait_for("1764428000123-web1-03")
    assert heard.mids == ["1764428000123-web1-03"]


@pytest.mark.redis
async def test_the_asking_instance_hears_its_own_stop_exactly_once(
    controls: list[RedisControl],
) -> None:
    asker, other = controls
    asked_here, heard_there = Recorder(), Recorder()
    asker.on_stop(asked_here)
    other.on_stop(heard_there)
    await asker.start()
    await other.start()

    await asker.request_stop("m1")
    # Told locally at once, without a Redis hop.
    assert asked_here.mids == ["m1"]
    # Pub/sub keeps order per connection: once the other instance has heard m2, m1's message
    # has come back through the asker's own subscription too, and was skipped there.
    await asker.request_stop("m2")
    await heard_there.wait_for("m2")
    await other.request_stop("m3")
    await asked_here.wait_for("m3")
    assert asked_here.mids == ["m1", "m2", "m3"]


@pytest.mark.redis
async def test_a_stop_is_published_as_json_with_op_and_mid(
    prefix: str, controls: list[RedisControl]
) -> None:
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(f"{prefix}control")
        await controls[0].request_stop("m1")
        async with asyncio.timeout(10):
            message = None
            while message is None:
                message = await pubsub.get_message(timeout=1.0)
        payload = json.loads(message["data"])
        assert (payload["op"], payload["mid"]) == ("stop", "m1")
    finally:
        await pubsub.aclose()
        await client.aclose()


@pytest.mark.redis
async def test_stop_requested_holds_for_a_minute_for_an_owner_that_missed_the_message(
    prefix: str, controls: list[RedisControl]
) -> None:
    asker, owner = controls  # the owner never subscribed: it was away from pub/sub
    assert not await owner.stop_requested("m1")

    await asker.request_stop("m1")

    assert await owner.stop_requested("m1")
    assert not await owner.stop_requested("m2")
    with redis.Redis.from_url(REDIS_URL) as client:
        assert 0 < client.ttl(f"{prefix}stop:m1") <= STOP_KEY_SECONDS


@pytest.mark.redis
async def test_start_is_idempotent(prefix: str, controls: list[RedisControl]) -> None:
    owner = controls[1]
    await owner.start()
    await owner.start()
    assert subscribers(prefix) == 1

    await owner.aclose()
    await eventually(lambda: subscribers(prefix) == 0, "the subscription ended")


@pytest.mark.redis
async def test_the_subscriber_comes_back_after_redis_drops_its_connection(
    prefix: str, controls: list[RedisControl]
) -> None:
    asker, owner = controls
    heard = Recorder()
    owner.on_stop(heard)
    await owner.start()
    errors_before = control_module.stats.subscriber_errors

    with redis.Redis.from_url(REDIS_URL) as client:
        killed = 0
        for conn in client.client_list():
            if conn.get("name") == f"{prefix}control-sub":
                killed += client.client_kill_filter(_id=conn["id"])
    assert killed == 1

    await eventually(
        lambda: control_module.stats.subscriber_errors > errors_before, "the loss was noticed"
    )
    await eventually(lambda: subscribers(prefix) == 1, "subscribed again")
    await asker.request_stop("m1")
    await heard.wait_for("m1")


@pytest.mark.redis
async def test_request_stop_still_reaches_the_local_owner_when_redis_is_unreachable(
    prefix: str,
) -> None:
    control = RedisControl(UNREACHABLE_URL, prefix, start_wait=0.2)
    heard = Recorder()
    control.on_stop(heard)
    errors_before = control_module.stats.publish_errors
    try:
        await control.start()  # returns although it cannot subscribe; keeps trying
        await control.request_stop("m1")  # does not raise

        assert heard.mids == ["m1"]
        assert control_module.stats.publish_errors == errors_before + 1
        assert not await control.stop_requested("m1")
    finally:
        await control.aclose()


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_failing_callback_does_not_keep_the_stop_from_the_others(
    kind: str, prefix: str
) -> None:
    control: Control = MemoryControl() if kind == "memory" else RedisControl(REDIS_URL, prefix)
    heard = Recorder()

    def broken(mid: str) -> None:
        raise RuntimeError("a bug in someone's callback")

    control.on_stop(broken)
    control.on_stop(heard)
    try:
        await control.request_stop("m1")
        assert heard.mids == ["m1"]
    finally:
        await control.aclose()


async def test_memory_control_tells_local_callbacks_and_remembers_the_stop_for_a_minute() -> None:
    now = [500.0]
    control = MemoryControl(clock=lambda: now[0])
    heard = Recorder()
    control.on_stop(heard)
    await control.start()

    await control.request_stop("m1")

    assert heard.mids == ["m1"]
    assert await control.stop_requested("m1")
    assert not await control.stop_requested("m2")
    now[0] += STOP_KEY_SECONDS + 1
    assert not await control.stop_requested("m1")


@pytest.mark.redis
def test_get_control_gives_one_control_per_event_loop_chosen_by_redis_url(
    settings: Any, prefix: str
) -> None:
    async def twice() -> tuple[Control, Control]:
        return get_control(), get_control()

    settings.REDIS_URL = ""
    first, again = asyncio.run(twice())
    other_loop, _ = asyncio.run(twice())
    assert first is again
    assert other_loop is not first
    assert isinstance(first, MemoryControl)

    settings.REDIS_URL = REDIS_URL
    settings.CHAT_REDIS_PREFIX = prefix

    async def on_redis() -> Control:
        control = get_control()
        try:
            await control.request_stop("m1")
            assert await control.stop_requested("m1")
        finally:
            await loop_controls.close()
        return control

    assert isinstance(asyncio.run(on_redis()), RedisControl)
