"""Exports: a conversation's branch on show as Markdown or JSON, all of a person's data (every
branch of every conversation, their settings) as JSON, and the snapshot a shared link shows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from chat.branches import thread
from chat.json_pieces import Items
from chat.models import Conversation, Feedback, Message, Preferences

FORMAT_VERSION = 1


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def message_record(m: Message, parent: str | None = None) -> dict[str, Any]:
    """One message as exported: with the model, tier, times and usage of an answer. `parent`:
    the id of the message it answers or follows, with which the tree of versions is rebuilt."""
    record: dict[str, Any] = {
        "id": m.mid,
        "parent": parent,
        "role": m.role,
        "text": m.text,
        "created_at": _time(m.created_at),
    }
    if m.role == Message.Role.ASSISTANT:
        record.update(
            status=m.status,
            error=m.error,
            model=m.model,
            tier=m.tier,
            picked=m.picked,
            finished_at=_time(m.finished_at),
            usage={
                "prompt_tokens": m.prompt_tokens,
                "completion_tokens": m.completion_tokens,
                "estimated": m.usage_estimated,
            },
        )
    return record


# How many messages (full rows) and conversations an export holds at a time: it is written as
# it is read, so its memory does not grow with the person's data (issue 19's review, finding 2).
MESSAGES_AT_ONCE = 200
CONVERSATIONS_AT_ONCE = 20


@dataclass(frozen=True)
class Outline:
    """A conversation's messages without their texts: enough to find the branch on show and each
    message's parent id, and to read the rows a batch at a time. Created order."""

    ids: list[int]
    mids: dict[int, str]
    parents: dict[int, int | None]

    def branch_on_show(self, leaf_id: int | None) -> list[int]:
        """The ids of the branch the page shows, root first (as branches.thread walks it)."""
        if not self.ids:
            return []
        node: int | None = leaf_id if leaf_id in self.mids else self.ids[-1]
        path = []
        while node is not None:
            path.append(node)
            node = self.parents.get(node)
        return path[::-1]


def _outlines(conversation_ids: list[Any]) -> dict[Any, Outline]:
    """The outlines of these conversations, in one query."""
    outlines = {cid: Outline([], {}, {}) for cid in conversation_ids}
    rows = (
        Message.objects.filter(conversation_id__in=conversation_ids)
        .order_by("created_at", "id")
        .values_list("id", "conversation_id", "parent_id", "mid")
    )
    for pk, cid, parent_id, mid in rows:
        outline = outlines[cid]
        outline.ids.append(pk)
        outline.mids[pk] = mid
        outline.parents[pk] = parent_id
    return outlines


def _rows(model: Any, ids: list[Any], size: int) -> Iterator[Any]:
    """The rows of these ids in this order, read `size` at a time (None for one deleted since)."""
    for start in range(0, len(ids), size):
        batch = ids[start : start + size]
        found = {row.pk: row for row in model.objects.filter(pk__in=batch).order_by()}
        yield from (found.get(pk) for pk in batch)


def conversation_record(
    conversation: Conversation,
    outline: Outline,
    rows: Iterator[Message | None],
    *,
    every_branch: bool = False,
) -> dict[str, Any]:
    """The conversation, its settings (the model picked for it, its system prompt) and its
    branch on show (the messages the page shows), root first. `every_branch`: the messages
    are all of them, every version of every answer and edit, oldest first, and
    `branch_on_show` lists the ids of the ones the page shows. The messages are drawn from
    `rows` (the full rows of `exported_ids`, in order) as they are written."""
    on_show = outline.branch_on_show(conversation.leaf_id)
    count = len(outline.ids) if every_branch else len(on_show)

    def exported() -> Iterator[dict[str, Any]]:
        for m in islice(rows, count):
            if m is not None:
                parent = outline.mids.get(m.parent_id) if m.parent_id else None
                yield message_record(m, parent)

    record = {
        "id": str(conversation.id),
        "title": conversation.title,
        "pinned": conversation.pinned,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "created_at": _time(conversation.created_at),
        "updated_at": _time(conversation.updated_at),
        "messages": Items(exported()),
    }
    if every_branch:
        record["branch_on_show"] = [outline.mids[pk] for pk in on_show]
    return record


def exported_ids(conversation: Conversation, outline: Outline, *, every_branch: bool) -> list[int]:
    return outline.ids if every_branch else outline.branch_on_show(conversation.leaf_id)


def conversation_document(conversation: Conversation) -> dict[str, Any]:
    """`/c/<id>/export.json`: written as it is read (json_pieces), its messages a batch at a
    time, however long the conversation."""
    outline = _outlines([conversation.pk])[conversation.pk]
    ids = exported_ids(conversation, outline, every_branch=False)
    return {
        "format": "chatsite.conversation",
        "version": FORMAT_VERSION,
        "exported_at": _time(timezone.now()),
        "conversation": conversation_record(
            conversation, outline, _rows(Message, ids, MESSAGES_AT_ONCE)
        ),
    }


def conversation_markdown(conversation: Conversation) -> str:
    """The branch on show as a Markdown document: a heading per message, the text as written."""
    lines = [
        f"# {conversation.title}",
        "",
        f"*Exported from chatsite on {timezone.now():%Y-%m-%d %H:%M} UTC.*",
        "",
    ]
    for entry in thread(conversation):
        m = entry.message
        if m.role == Message.Role.USER:
            lines.append(f"## You · {m.created_at:%Y-%m-%d %H:%M} UTC")
        else:
            details = [m.model or "unknown model"]
            if m.picked:
                details.append("picked")
            elif m.tier:
                details.append(f"{m.tier} tier")
            details.append(f"{m.prompt_tokens} tokens in, {m.completion_tokens} out")
            if m.status != Message.Status.COMPLETE:
                details.append(m.status)
            lines.append(f"## Assistant · {' · '.join(details)}")
        lines += ["", m.text.rstrip() or "*(empty)*", ""]
        if m.role != Message.Role.USER and m.error:
            # What the page said under the answer ("The model server had a problem…"): a failed
            # answer is not an empty one.
            lines += [f"*({m.error.rstrip('.')}.)*", ""]
    return "\n".join(lines)


def _every_conversation(user_id: int) -> Iterator[dict[str, Any]]:
    """Each of the person's conversations with every branch, CONVERSATIONS_AT_ONCE at a time
    (their outlines in one query), their messages MESSAGES_AT_ONCE at a time."""
    ids = list(Conversation.objects.filter(user_id=user_id).values_list("pk", flat=True))
    for start in range(0, len(ids), CONVERSATIONS_AT_ONCE):
        batch = ids[start : start + CONVERSATIONS_AT_ONCE]
        found = {c.pk: c for c in Conversation.objects.filter(pk__in=batch).order_by()}
        conversations = [found[pk] for pk in batch if pk in found]
        outlines = _outlines([c.pk for c in conversations])
        message_ids = [
            pk for c in conversations for pk in exported_ids(c, outlines[c.pk], every_branch=True)
        ]
        rows = _rows(Message, message_ids, MESSAGES_AT_ONCE)
        for c in conversations:
            yield conversation_record(c, outlines[c.pk], rows, every_branch=True)


def _every_vote(user_id: int) -> Iterator[dict[str, Any]]:
    ids = list(Feedback.objects.filter(user_id=user_id).values_list("pk", flat=True))
    for start in range(0, len(ids), MESSAGES_AT_ONCE):
        batch = ids[start : start + MESSAGES_AT_ONCE]
        votes = Feedback.objects.filter(pk__in=batch).select_related("message").order_by()
        found = {f.pk: f for f in votes}
        for f in (found[pk] for pk in batch if pk in found):
            yield {
                "message": f.message.mid,
                "vote": f.vote,
                "comment": f.comment,
                "updated_at": _time(f.updated_at),
            }


def account_document(user: AbstractBaseUser, user_id: int) -> dict[str, Any]:
    """Everything of a person's: the account, their custom instructions, every conversation
    (its settings and every branch) and their feedback. Written as it is read (json_pieces):
    a bounded number of conversations and messages in memory at a time, and a number of
    queries that grows with the batches, not with each conversation."""
    instructions = (
        Preferences.objects.filter(user_id=user_id).values_list("instructions", flat=True).first()
    )
    return {
        "format": "chatsite.account",
        "version": FORMAT_VERSION,
        "exported_at": _time(timezone.now()),
        "user": {
            "username": user.get_username(),
            "email": getattr(user, "email", ""),
            "date_joined": _time(getattr(user, "date_joined", None)),
        },
        "settings": {"instructions": instructions or ""},
        "conversations": Items(_every_conversation(user_id)),
        "feedback": Items(_every_vote(user_id)),
    }


def snapshot_of(conversation: Conversation) -> list[dict[str, Any]]:
    """What a shared link shows: the finished messages of the branch on show, each answer with
    its stored sanitised HTML (the same rendering as the page), nothing still streaming."""
    snapshot = []
    for entry in thread(conversation, render=True):
        m = entry.message
        if m.status == Message.Status.STREAMING:
            continue
        snapshot.append(
            {
                "role": m.role,
                "text": m.text,
                "html": entry.rendered,
                "model": m.model,
                "status": m.status,
                # The note the page shows under a failed, stopped or cut answer.
                "error": m.error,
                "created_at": _time(m.created_at),
            }
        )
    return snapshot
