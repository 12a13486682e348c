"""Signal receivers: logging out, deactivation or a password change closes the user's sockets;
admin edits of plans, quotas, tier rules and model tiers take effect at once."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.core.signals import setting_changed
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from chat.events import send_to_user, send_to_user_on_commit
from chat.limits.plans import forget_cached_limits
from chat.models import DeviceRule, ModelTier, PickableModel, Plan, Quota
from chat.tiers.policy import clear_policy_cache


def close_sockets_of(user_id: int) -> None:
    """Close every socket of the user, on every instance (they get 4401 and go to login).

    While Redis is away this cannot reach them; each socket's per-prompt session check then
    refuses their next prompt instead.
    """
    async_to_sync(send_to_user)(user_id, {"type": "chat.logout"})


@receiver(user_logged_out)
def close_sockets_on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        close_sockets_of(user.pk)


@receiver(post_save, sender=get_user_model())
def close_sockets_of_changed_users(
    sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any
) -> None:
    """A deactivated user loses every socket; after any other save that may have changed the
    password, each socket re-checks its own session (the session auth hash) and the ones made
    with the old password close with 4401, on every instance (issue 13.3)."""
    if not instance.is_active:
        close_sockets_of(instance.pk)
    elif not kwargs.get("created") and (update_fields is None or "password" in update_fields):
        # After the commit: a socket checking before it would still read the old password.
        # (A login saves only last_login, which changes nothing here.)
        send_to_user_on_commit(instance.pk, {"type": "chat.session_check"})


@receiver([post_save, post_delete], sender=Plan)
@receiver([post_save, post_delete], sender=Quota)
def limits_changed(sender: Any, **kwargs: Any) -> None:
    # One plan edit can change many users' limits: drop every cached resolution.
    forget_cached_limits()


@receiver([post_save, post_delete], sender=DeviceRule)
@receiver([post_save, post_delete], sender=ModelTier)
@receiver([post_save, post_delete], sender=PickableModel)
@receiver(m2m_changed, sender=PickableModel.plans.through)
def tier_policy_changed(sender: Any, **kwargs: Any) -> None:
    clear_policy_cache()
    # Inside a transaction a reload could still read the old rows until the commit, so drop
    # the cache again once it is committed (on_commit runs at once outside a transaction).
    transaction.on_commit(clear_policy_cache, using=kwargs.get("using"))


LIMIT_SETTINGS = frozenset(
    {"CHAT_RATE_LIMIT", "CHAT_DAILY_TOKENS", "CHAT_MAX_CONCURRENT_STREAMS", "CHAT_MODEL_FULL"}
)


@receiver(setting_changed)
def settings_changed(*, setting: str, **kwargs: Any) -> None:
    # Tests override settings: cached resolutions made from the old values must go.
    if setting in LIMIT_SETTINGS:
        forget_cached_limits()
    if setting in {"CHAT_MODEL_FULL", "CHAT_MODEL_LITE"}:
        clear_policy_cache()
