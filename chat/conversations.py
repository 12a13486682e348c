"""Conversations and messages: reads of the branch on show, and writes, checked (`check_*`) then
done (`do_*`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from chat import branches, turn_rows
from chat.ids import new_message_id
from chat.models import Conversation, Message
from chat.preferences import (
    chosen_model,
    model_for,
    system_message,
    system_message_from,
)
from chat.protocol import MID_MAX_CHARS, is_text
from chat.tokens import chars_to_tokens

INTERRUPTED = "The answer was interrupted (the server stopped). You can retry."
DELETED = "This conversation was deleted, so its answer was stopped."


class NotFound(Exception):
    """An id that does not exist or belongs to someone else: both look the same to the caller."""


class BadRequest(Exception):
    """A frame or form that cannot be acted on; the message is shown to the user."""


class SessionEnded(Exception):
    """The socket's session ended (logout elsewhere, deactivation, a password change) since it
    connected."""


def title_from_prompt(text: str) -> str:
    line = " ".join(text.split())
    return (line[:60] + "…") if len(line) > 61 else (line or "New chat")


def check_conversation(user_id: int, conversation_id: Any) -> Conversation:
    try:
        return Conversation.objects.get(id=str(conversation_id), user_id=user_id)
    except (Conversation.DoesNotExist, ValidationError, ValueError):
        # Not a UUID, unknown, or someone else's: the same answer, so ids cannot be probed.
        raise NotFound("That conversation does not exist.") from None


def check_message(user_id: int, mid: Any) -> Message:
    if not isinstance(mid, str) or not mid:
        raise BadRequest("A message id is required.")
    if len(mid) > MID_MAX_CHARS or not is_text(mid):  # no such id can exist
        raise NotFound("That message does not exist.")
    try:
        return Message.objects.select_related("conversation").get(
            mid=mid, conversation__user_id=user_id, role=Message.Role.ASSISTANT
        )
    except Message.DoesNotExist:
        raise NotFound("That message does not exist.") from None


@dataclass(frozen=True)
class Exchange:
    """What a new prompt created: the conversation (maybe new), both messages, the history.

    `prompt` is None for a regeneration (the answer follows an existing prompt). `fork_after`
    is set when the branch on show changed (an edit, a regeneration): the mid of the message
    the new branch goes on from ("" for a new first prompt); the page drops what followed it
    and appends the new messages. None: the exchange simply goes on from the leaf.
    """

    conversation: Conversation
    created: bool
    prompt: Message | None
    answer: Message
    history: list[dict[str, str]]
    fork_after: str | None = None
    continued: bool = False  # Continue: `answer` is an earlier answer going on (no prompt)

    @property
    def forked(self) -> bool:
        return self.fork_after is not None


def _chars(history: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in history)


def _new_answer(
    conversation: Conversation,
    parent: Message,
    *,
    model: str,
    tier: str,
    picked: bool,
    admission: dict[str, Any] | None,
    history_chars: int,
) -> Message:
    """The empty streaming answer, with the admission of its turn to release if it dies."""
    if admission is not None:
        # The prompt's share of what a dead turn is charged: the history it sent, as trimmed.
        sent = min(history_chars, settings.LLM_CONTEXT_CHARS)
        admission = {**admission, "prompt_tokens": chars_to_tokens(sent)}
    answer = Message(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        parent=parent,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        model=model,
        tier=tier,
        picked=picked,
        owner=settings.CHAT_INSTANCE_ID,
        lease_until=timezone.now() + timedelta(seconds=settings.CHAT_LEASE_SECONDS),
        admission=admission,
    )
    turn_rows.insert_message(connections[DEFAULT_DB_ALIAS], answer)
    return answer


def do_start_exchange(
    user_id: int,
    conversation_id: str | None,
    text: str,
    *,
    model: str,
    tier: str,
    replaces: str | None = None,
    admission: dict[str, Any] | None = None,
    picked: str | None = None,
    allowed: frozenset[str] = frozenset(),
) -> Exchange:
    """Store the prompt and an empty streaming answer in one transaction.

    `model` is the device tier's default, `picked` the model the frame asked for (already
    checked against `allowed`, what this connection may pick); the history starts with the
    system message (custom instructions and the conversation's system prompt).

    With `replaces` (the mid of an earlier prompt of this conversation) the prompt is an edit:
    a new version of that prompt, and the conversation continues from there on a new branch.

    Every turn's start runs this on the one ORM thread, so its statements are written out
    (docs/decisions/performance.md, issue 18): the rows are the ones the ORM stored, from the
    models' own fields and defaults. A follow-up reads its conversation and the user's custom
    instructions in one statement, and its new leaf (and a newly picked model) in one
    `UPDATE`; a new conversation reads the instructions with its prompt's `INSERT` and is
    inserted last, its leaf already set (the messages' reference to it is checked at COMMIT,
    as Django declares every foreign key deferred).
    """
    db = connections[DEFAULT_DB_ALIAS]
    with transaction.atomic():
        instructions: str | None = None
        if conversation_id:
            found = turn_rows.conversation_of_turn(db, user_id, conversation_id)
            if found is None:
                raise NotFound("That conversation does not exist.")
            conversation, instructions = found
            created = False
        else:
            if replaces:
                raise BadRequest("An edit needs its conversation.")
            # Inserted once its answer exists (below), with the leaf pointing at it.
            conversation = Conversation(
                user_id=user_id,
                title=title_from_prompt(text),
                model=picked or "",
                created_at=timezone.now(),
            )
            created = True
        default, model = model, chosen_model(conversation, model, picked, allowed)
        # A newly picked model is remembered with the leaf (one UPDATE for both).
        remember = bool(picked) and not created and conversation.model != picked
        if remember:
            conversation.model = model
        fork_after: str | None = None
        if replaces:
            # A prompt of this conversation, and on the branch on show (the database walks up
            # from the leaf to it: one query however deep the edit).
            edited = (
                conversation.messages.select_related("parent")
                .filter(mid=str(replaces), role=Message.Role.USER)
                .first()
            )
            if edited is None or not branches.on_branch(conversation, edited.pk):
                raise NotFound("That message is not a prompt on this conversation's branch.")
            parent_id = edited.parent_id
            fork_after = edited.parent.mid if edited.parent else ""
        else:
            parent_id = None if created else branches.leaf_id(conversation)
        prompt = Message(
            mid=new_message_id(conversation.shard),
            conversation=conversation,
            parent_id=parent_id,
            role=Message.Role.USER,
            text=text,
            status=Message.Status.COMPLETE,
        )
        if created:
            instructions = turn_rows.insert_message(db, prompt, instructions_of=user_id)
        else:
            turn_rows.insert_message(db, prompt)
        history = [
            *system_message_from(instructions, conversation),
            *branches.history_to(
                parent_id, extra_chars=len(text), budget=settings.LLM_CONTEXT_CHARS
            ),
            {"role": "user", "content": text},
        ]
        answer = _new_answer(
            conversation,
            prompt,
            model=model,
            tier=tier,
            picked=model != default,
            admission=admission,
            history_chars=_chars(history),
        )
        conversation.leaf = answer
        if created:
            conversation.updated_at = timezone.now()
            turn_rows.insert_conversation(db, conversation)
        else:
            turn_rows.set_leaf(db, conversation, answer, model=model if remember else None)
    return Exchange(conversation, created, prompt, answer, history, fork_after=fork_after)


def do_regenerate(
    user_id: int,
    answer_mid: str,
    *,
    model: str,
    tier: str,
    admission: dict[str, Any] | None = None,
    picked: str | None = None,
    allowed: frozenset[str] = frozenset(),
) -> Exchange:
    """A new version of a finished answer: the same prompt asked again, on a new branch."""
    with transaction.atomic():
        old = check_message(user_id, answer_mid)
        if old.status == Message.Status.STREAMING:
            raise BadRequest("That answer is still streaming; stop it first.")
        conversation = old.conversation
        prompt = old.parent
        if prompt is None:
            raise BadRequest("That answer has no prompt to ask again.")
        default, model = model, model_for(conversation, model, picked, allowed)
        history = [
            *system_message(user_id, conversation),
            *branches.history_to(prompt.pk, extra_chars=0, budget=settings.LLM_CONTEXT_CHARS),
        ]
        answer = _new_answer(
            conversation,
            prompt,
            model=model,
            tier=tier,
            picked=model != default,
            admission=admission,
            history_chars=_chars(history),
        )
        conversation.leaf = answer
        turn_rows.set_leaf(connections[DEFAULT_DB_ALIAS], conversation, answer)
    return Exchange(conversation, False, None, answer, history, fork_after=prompt.mid)


def do_switch_version(user_id: int, conversation_id: str, mid: str) -> Conversation:
    """Show another version of a message: the branch continues to that version's newest leaf."""
    conversation = check_conversation(user_id, conversation_id)
    try:
        node = conversation.messages.get(mid=mid)
    except Message.DoesNotExist:
        raise NotFound("That message does not exist.") from None
    # The newest continuation, walked in the database: the branch below can be long.
    conversation.leaf_id = branches.newest_leaf_below(node)
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
    html: str | None = None,
    status: str,
    error: str,
    chunk_count: int,
    prompt_tokens: int,
    completion_tokens: int,
    usage_estimated: bool,
    ttft_ms: int | None,
) -> Message | None:
    """Save a finished answer and return it as saved, for its final frame and `done` (None:
    the conversation was deleted while the answer streamed). One statement, written out
    (chat.turn_rows.finish_answer): the ORM's update compiled per turn and a second statement
    reading the row back took more than the write (docs/decisions/performance.md, issue 18)."""
    return turn_rows.finish_answer(
        connections[DEFAULT_DB_ALIAS],
        mid,
        {
            "text": text,
            "html": html,
            "status": status,
            # PostgreSQL text cannot hold NUL; an upstream's error text is not ours to trust.
            "error": error.replace("\x00", "")[:300],
            "chunk_count": chunk_count,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "usage_estimated": usage_estimated,
            "ttft_ms": ttft_ms,
        },
    )


def orphans() -> QuerySet[Message]:
    return Message.objects.filter(status=Message.Status.STREAMING, lease_until__lt=timezone.now())


@dataclass(frozen=True)
class Orphan:
    """A streaming answer whose turn is gone, as its last checkpoint left it."""

    mid: str
    user_id: int
    text: str
    chunk_count: int
    admission: dict[str, Any] | None


def orphans_to_reap(*, instance: str | None = None, mid: str | None = None) -> list[Orphan]:
    """Answers whose turn is gone: every streaming answer `instance` owned (it has just
    started, so none of them can still run); with `mid`, that answer if its lease ran out;
    with neither, every answer whose lease ran out (their instance died)."""
    if instance is not None:
        qs = Message.objects.filter(status=Message.Status.STREAMING, owner=instance)
    else:
        qs = orphans()
        if mid is not None:
            qs = qs.filter(mid=mid)
    rows = qs.values_list("mid", "conversation__user_id", "text", "chunk_count", "admission")
    return [Orphan(*row) for row in rows]


def do_reap(
    mid: str,
    *,
    text: str,
    chunk_count: int,
    html: str,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> Message | None:
    """Mark an orphan failed with the text it had reached (`text`, its first `chunk_count`
    chunks: the longer of its checkpoint and its stream log), adding its dead turn's estimated
    usage to what the answer had used (a continued answer used some before). None if it no
    longer streams: another instance reaped it first, or its turn was alive after all and
    finished; only the one who marks it releases what its turn held."""
    updated = Message.objects.filter(mid=mid, status=Message.Status.STREAMING).update(
        text=text,
        html=html,
        chunk_count=chunk_count,
        status=Message.Status.FAILED,
        error=INTERRUPTED,
        prompt_tokens=F("prompt_tokens") + prompt_tokens,
        completion_tokens=F("completion_tokens") + completion_tokens,
        usage_estimated=True,
        lease_until=None,
        finished_at=timezone.now(),
    )
    if not updated:
        return None
    return Message.objects.select_related("conversation").get(mid=mid)


def streaming_answers(conversation: Conversation) -> list[str]:
    """The mids of the conversation's answers still streaming (to stop them on delete)."""
    return list(
        conversation.messages.filter(status=Message.Status.STREAMING).values_list("mid", flat=True)
    )


def do_rename_conversation(conversation: Conversation, title: str) -> Conversation:
    title = " ".join(title.split())[:200]
    if not title:
        raise BadRequest("A title cannot be empty.")
    conversation.title = title
    conversation.title_by_hand = True  # a generated title never replaces it
    conversation.save(update_fields=["title", "title_by_hand"])
    return conversation
