"""The one-process channel layer (chat/sockets/memory_layer.py): Channels' in-memory layer
whose expiry sweep runs at most once a second instead of on every receive and group_send."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from chat.sockets.memory_layer import MemoryChannelLayer


def test_without_redis_the_site_uses_it() -> None:
    # A run with REDIS_URL set uses the Redis layer; every other run must use this one.
    if not settings.REDIS_URL:
        assert isinstance(get_channel_layer(), MemoryChannelLayer)
    else:
        assert "RedisChannelLayer" in settings.CHANNEL_LAYERS["default"]["BACKEND"]


async def test_many_events_sweep_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sweeps = []
    original = InMemoryChannelLayer._clean_expired
    monkeypatch.setattr(
        InMemoryChannelLayer, "_clean_expired", lambda self: sweeps.append(1) or original(self)
    )
    layer = MemoryChannelLayer()
    names = [await layer.new_channel() for _ in range(50)]
    for name in names:
        await layer.group_add("user.1", name)
    for _ in range(20):
        await layer.group_send("user.1", {"type": "note"})
    got = await asyncio.gather(*(layer.receive(name) for name in names))
    assert [message["type"] for message in got] == ["note"] * 50
    # Channels' own layer sweeps 70 times here (20 sends, 50 receives), each over all 50.
    assert len(sweeps) == 1


async def test_expired_messages_and_their_channels_still_go() -> None:
    """A message past its expiry is dropped, and its channel leaves its groups (Channels'
    rule), by the first sweep after it expired: at most a second late."""
    layer = MemoryChannelLayer(expiry=0.05)
    layer.sweep_every = 0.1
    stale, live = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("user.1", stale)
    await layer.send(stale, {"type": "old"})
    await asyncio.sleep(0.2)  # past the message's expiry and the next sweep's time
    await layer.group_add("user.1", live)
    await layer.group_send("user.1", {"type": "new"})  # sweeps first, then sends
    assert stale not in layer.channels
    assert list(layer.groups["user.1"]) == [live]
    assert (await layer.receive(live))["type"] == "new"
