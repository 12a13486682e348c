"""Signal receivers: a user who logs out or is deactivated loses their open sockets at once."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_save
from django.dispatch import receiver
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


def _close_sockets_of(user_id: int) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(f"user.{user_id}", {"type": "chat.logout"})
    except (RedisError, OSError) as exc:
        # Logging out must work while Redis is away; the sockets' per-prompt session check
        # refuses their next prompt instead.
        log.warning("could not close the sockets of user %s now: %s", user_id, exc)


@receiver(user_logged_out)
def close_sockets_on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        _close_sockets_of(user.pk)


@receiver(post_save, sender=get_user_model())
def close_sockets_of_deactivated_users(sender: Any, instance: Any, **kwargs: Any) -> None:
    if not instance.is_active:
        _close_sockets_of(instance.pk)
