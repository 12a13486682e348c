"""Events to a user's open tabs through the channel layer: the group name, sending, on commit.

The channel layer carries rare control events only (a new exchange for the other tabs, a
logout); per-token traffic goes through the stream log (channels-redis drops group messages
silently when a channel is full: PITFALLS).
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from chat.redis_clients import REDIS_DOWN

log = logging.getLogger(__name__)

# What the channel layer raises while Redis is away (restarting, failing over).
LAYER_DOWN = REDIS_DOWN


def user_group(user_id: int) -> str:
    """The group every open socket of this user joins."""
    return f"user.{user_id}"


async def send_to_user(user_id: int, event: dict[str, Any]) -> bool:
    """Send `event` to every socket of the user (on any instance); False while the layer is down."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        await layer.group_send(user_group(user_id), event)
    except LAYER_DOWN as exc:
        log.warning("could not send %s to the tabs of user %s: %s", event["type"], user_id, exc)
        return False
    return True


def send_to_user_on_commit(user_id: int, event: dict[str, Any]) -> None:
    """From sync code: send once the transaction in progress commits (now, outside one).

    A tab told before the commit could read the database and not find what it was told of.
    """
    transaction.on_commit(lambda: async_to_sync(send_to_user)(user_id, event))
