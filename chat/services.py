"""Writes of the chat: conversations and messages, checked (`check_*`) then done (`do_*`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, QuerySet
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
    if not is_text(text):
        raise BadRequest("That message holds characters that are not text (unpaired surrogates).")
    return text


def is_text(value: str) -> bool:
    """Whether `value` can be stored and sent as UTF-8: JSON lets a raw client send unpaired
    surrogates ("\\ud800"), which the database driver and the socket would fail to encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_conversation(user_id: int, conversation_id: Any) -> Conversation:
    try:
        return Conversation.objects.get(id=str(conversation_id), user_id=user_id)
    except (Conversation.DoesNotExist, ValidationError, ValueError):
        # Not a UUID, unknown, or someone else's: the same answer, so ids cannot be probed.
        raise NotFound("That conversation does not exist.") from None


def check_message(user_id: int, mid: Any) -> Message:
    if not isinstance(mid, str) or not mid:
        raise BadRequest("A message id is required.")
    if len(mid) > 80 or not is_text(mid):  # Message.mid holds 80 characters of text
        raise NotFound("That message does not exist.")  # no such id can exist
    try:
        return Message.objects.select_related("conversation").get(
            mid=mid, conversation__user_id=user_id, role=Message.Role.ASSISTANT
        )
    except Message.DoesNotExist:
        raise NotFound("That message does not exist.") from None


@dataclass(frozen=True)
class Exchange:
    """What a new prompt created: the conversation (maybe new), both messages, the history.

    `prompt` is None for a regeneration (the answer follows an existing prompt); `forked` says
    the branch on show changed, so the page shows the thread anew instead of appending to it.
    """

    conversation: Conversation
    created: bool
    prompt: Message | None
    answer: Message
    history: list[dict[str, str]]
    forked: bool = False


@dataclass(frozen=True)
class ThreadEntry:
    """A message on the branch on show, and where it stands among its versions."""

    message: Message
    version: int  # 1-based
    versions: int
    previous: str  # mid of the previous version, "" if none
    next: str
    rendered: str = ""  # the finished answer as sanitised HTML, when asked for


def rendered_html(message: Message) -> str:
    """A finished answer as sanitised HTML; empty for prompts and streaming answers."""
    from chat.rendering import render_markdown

    finished = message.role == Message.Role.ASSISTANT and message.status != Message.Status.STREAMING
    return render_markdown(message.text) if finished and message.text else ""


def thread(conversation: Conversation, *, render: bool = False) -> list[ThreadEntry]:
    """The branch on show, root first: one query, then a walk up from the leaf.

    With `render`, finished answers come with their HTML (markdown rendering is not free).
    """
    messages = list(conversation.messages.all())
    if not messages:
        return []
    by_id = {m.pk: m for m in messages}
    siblings: dict[tuple[int | None, str], list[Message]] = {}
    for m in messages:  # created order, so each version list is oldest first
        siblings.setdefault((m.parent_id, m.role), []).append(m)
    leaf = by_id.get(conversation.leaf_id or -1) or messages[-1]
    path: list[Message] = []
    node: Message | None = leaf
    while node is not None:
        path.append(node)
        node = by_id.get(node.parent_id) if node.parent_id else None
    path.reverse()
    entries = []
    for m in path:
        versions = siblings[(m.parent_id, m.role)]
        i = versions.index(m)
        entries.append(
            ThreadEntry(
                m,
                i + 1,
                len(versions),
                versions[i - 1].mid if i > 0 else "",
                versions[i + 1].mid if i + 1 < len(versions) else "",
                rendered_html(m) if render else "",
            )
        )
    return entries


def entry_for(message: Message, *, render: bool = False) -> ThreadEntry:
    """One message as a ThreadEntry (its place among its versions), without the whole thread."""
    versions = list(
        Message.objects.filter(
            conversation_id=message.conversation_id, parent_id=message.parent_id, role=message.role
        )
        .order_by("created_at", "id")
        .values_list("mid", flat=True)
    )
    i = versions.index(message.mid) if message.mid in versions else 0
    return ThreadEntry(
        message,
        i + 1,
        max(1, len(versions)),
        versions[i - 1] if i > 0 else "",
        versions[i + 1] if i + 1 < len(versions) else "",
        rendered_html(message) if render else "",
    )


def _history(entries: list[ThreadEntry]) -> list[dict[str, str]]:
    return [{"role": e.message.role, "content": e.message.text} for e in entries if e.message.text]


def _path_to(conversation: Conversation, message: Message | None) -> list[ThreadEntry]:
    """The thread that ends at `message` (None: the empty thread before the first prompt)."""
    if message is None:
        return []
    conversation.leaf_id = message.pk
    return thread(conversation)


def _new_answer(conversation: Conversation, parent: Message, *, model: str, tier: str) -> Message:
    return Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        parent=parent,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        model=model,
        tier=tier,
        owner=settings.CHAT_INSTANCE_ID,
        lease_until=timezone.now() + timedelta(seconds=settings.CHAT_LEASE_SECONDS),
    )


def do_start_exchange(
    user_id: int,
    conversation_id: str | None,
    text: str,
    *,
    model: str,
    tier: str,
    replaces: str | None = None,
) -> Exchange:
    """Store the prompt and an empty streaming answer in one transaction.

    With `replaces` (the mid of an earlier prompt of this conversation) the prompt is an edit:
    a new version of that prompt, and the conversation continues from there on a new branch.
    """
    with transaction.atomic():
        if conversation_id:
            conversation = check_conversation(user_id, conversation_id)
            created = False
        else:
            if replaces:
                raise BadRequest("An edit needs its conversation.")
            conversation = Conversation.objects.create(
                user_id=user_id, title=title_from_prompt(text)
            )
            created = True
        entries = [] if created else thread(conversation)
        if replaces:
            at = next((i for i, e in enumerate(entries) if e.message.mid == replaces), None)
            if at is None or entries[at].message.role != Message.Role.USER:
                raise NotFound("That message is not a prompt on this conversation's branch.")
            before = entries[:at]
            parent = entries[at].message.parent
        else:
            before = entries
            parent = entries[-1].message if entries else None
        prompt = Message.objects.create(
            mid=new_message_id(conversation.shard),
            conversation=conversation,
            parent=parent,
            role=Message.Role.USER,
            text=text,
            status=Message.Status.COMPLETE,
        )
        answer = _new_answer(conversation, prompt, model=model, tier=tier)
        Conversation.objects.filter(pk=conversation.pk).update(
            leaf=answer, updated_at=timezone.now()
        )
        conversation.leaf = answer
    history = [*_history(before), {"role": "user", "content": text}]
    return Exchange(conversation, created, prompt, answer, history, forked=bool(replaces))


def do_regenerate(user_id: int, answer_mid: str, *, model: str, tier: str) -> Exchange:
    """A new version of a finished answer: the same prompt asked again, on a new branch."""
    with transaction.atomic():
        old = check_message(user_id, answer_mid)
        if old.status == Message.Status.STREAMING:
            raise BadRequest("That answer is still streaming; stop it first.")
        conversation = old.conversation
        prompt = old.parent
        if prompt is None:
            raise BadRequest("That answer has no prompt to ask again.")
        before = _path_to(conversation, prompt)
        answer = _new_answer(conversation, prompt, model=model, tier=tier)
        Conversation.objects.filter(pk=conversation.pk).update(
            leaf=answer, updated_at=timezone.now()
        )
        conversation.leaf = answer
    return Exchange(conversation, False, None, answer, _history(before), forked=True)


def do_switch_version(user_id: int, conversation_id: str, mid: str) -> Conversation:
    """Show another version of a message: the branch continues to that version's newest leaf."""
    conversation = check_conversation(user_id, conversation_id)
    try:
        node = conversation.messages.get(mid=mid)
    except Message.DoesNotExist:
        raise NotFound("That message does not exist.") from None
    children: dict[int, list[Message]] = {}
    for m in conversation.messages.exclude(parent=None).order_by("created_at", "id"):
        children.setdefault(m.parent_id or 0, []).append(m)
    while node.pk in children:
        node = children[node.pk][-1]  # the newest continuation
    conversation.leaf = node
    conversation.save(update_fields=["leaf"])
    return conversation


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
    active = get_user_model().objects.filter(pk=user_id, is_active=True)
    if settings.SESSION_ENGINE == "django.contrib.sessions.backends.db":
        # One query for both (this runs before every prompt): the session row, unexpired,
        # and its user still active.
        from django.contrib.sessions.models import Session

        return (
            Session.objects.filter(session_key=session_key, expire_date__gt=timezone.now())
            .filter(Exists(active))
            .exists()
        )
    if not active.exists():
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return bool(store().exists(session_key))
