"""Writes of the chat: conversations and messages, checked (`check_*`) then done (`do_*`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from chat.ids import new_message_id
from chat.models import Conversation, Message

INTERRUPTED = "The answer was interrupted (the server stopped). You can retry."


class NotFound(Exception):
    """An id that does not exist or belongs to someone else: both look the same to the caller."""


class BadRequest(Exception):
    """A frame or form that cannot be acted on; the message is shown to the user."""


User = AbstractBaseUser | AnonymousUser


def title_from_prompt(text: str) -> str:
    line = " ".join(text.split())
    return (line[:60] + "…") if len(line) > 61 else (line or "New chat")


def check_prompt_text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("Type a message first.")
    limit = settings.CHAT_MAX_PROMPT_CHARS
    if len(text) > limit:
        raise BadRequest(
            f"That message is {len(text):,} characters; the limit is {limit:,}. "
            "Shorten it or split it into parts."
        )
    return text


def check_conversation(user_id: int, conversation_id: Any) -> Conversation:
    try:
        return Conversation.objects.get(id=str(conversation_id), user_id=user_id)
    except (Conversation.DoesNotExist, ValidationError, ValueError):
        # Not a UUID, unknown, or someone else's: the same answer, so ids cannot be probed.
        raise NotFound("That conversation does not exist.") from None


def check_message(user_id: int, mid: Any) -> Message:
    if not isinstance(mid, str) or not mid:
        raise BadRequest("A message id is required.")
    try:
        return Message.objects.select_related("conversation").get(
            mid=mid, conversation__user_id=user_id, role=Message.Role.ASSISTANT
        )
    except Message.DoesNotExist:
        raise NotFound("That message does not exist.") from None


@dataclass(frozen=True)
class Exchange:
    """What a new prompt created: the conversation (maybe new), both messages, the history."""

    conversation: Conversation
    created: bool
    prompt: Message
    answer: Message
    history: list[dict[str, str]]


def do_start_exchange(
    user_id: int, conversation_id: str | None, text: str, *, model: str, tier: str
) -> Exchange:
    """Store the prompt and an empty streaming answer in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        if conversation_id:
            conversation = check_conversation(user_id, conversation_id)
            created = False
        else:
            conversation = Conversation.objects.create(
                user_id=user_id, title=title_from_prompt(text)
            )
            created = True
        history = [
            {"role": m.role, "content": m.text}
            for m in conversation.messages.exclude(text="").only("role", "text")
        ]
        prompt = Message.objects.create(
            mid=new_message_id(conversation.shard),
            conversation=conversation,
            role=Message.Role.USER,
            text=text,
            status=Message.Status.COMPLETE,
        )
        answer = Message.objects.create(
            mid=new_message_id(conversation.shard),
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            model=model,
            tier=tier,
            owner=settings.CHAT_INSTANCE_ID,
            lease_until=now + timedelta(seconds=settings.CHAT_LEASE_SECONDS),
        )
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=now)
    history.append({"role": "user", "content": text})
    return Exchange(conversation, created, prompt, answer, history)


def do_checkpoint(mid: str, text: str, chunk_count: int) -> None:
    """Save the partial answer and extend the lease, so a crash loses at most one interval."""
    Message.objects.filter(mid=mid, status=Message.Status.STREAMING).update(
        text=text,
        chunk_count=chunk_count,
        lease_until=timezone.now() + timedelta(seconds=settings.CHAT_LEASE_SECONDS),
    )


def do_finish_message(
    mid: str,
    *,
    text: str,
    status: str,
    error: str,
    chunk_count: int,
    prompt_tokens: int,
    completion_tokens: int,
    usage_estimated: bool,
    ttft_ms: int | None,
) -> Message | None:
    now = timezone.now()
    updated = Message.objects.filter(mid=mid).update(
        text=text,
        status=status,
        error=error[:300],
        chunk_count=chunk_count,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        usage_estimated=usage_estimated,
        ttft_ms=ttft_ms,
        lease_until=None,
        finished_at=now,
    )
    if not updated:
        return None  # the conversation was deleted while the answer streamed
    return Message.objects.select_related("conversation").get(mid=mid)


def orphans() -> QuerySet[Message]:
    return Message.objects.filter(status=Message.Status.STREAMING, lease_until__lt=timezone.now())


def do_reap_orphans(*, instance: str | None = None) -> int:
    """Mark answers whose turn is gone as failed, keeping their last checkpoint's text.

    With `instance`, every streaming answer that instance owned (it has just started, so none
    of them can still run); without, those whose lease ran out (their instance died).
    """
    if instance is not None:
        qs = Message.objects.filter(status=Message.Status.STREAMING, owner=instance)
    else:
        qs = orphans()
    return qs.update(
        status=Message.Status.FAILED,
        error=INTERRUPTED,
        lease_until=None,
        finished_at=timezone.now(),
    )


def do_rename_conversation(conversation: Conversation, title: str) -> Conversation:
    title = " ".join(title.split())[:200]
    if not title:
        raise BadRequest("A title cannot be empty.")
    conversation.title = title
    conversation.save(update_fields=["title"])
    return conversation


def user_is_active(user_id: int, session_key: str | None) -> bool:
    """Is the socket's user still logged in (session alive) and active? Checked per prompt."""
    from importlib import import_module

    from django.contrib.auth import get_user_model

    if session_key is None:
        return False
    if not get_user_model().objects.filter(pk=user_id, is_active=True).exists():
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return bool(store().exists(session_key))
