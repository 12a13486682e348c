"""Exports: a conversation's branch on show as Markdown or JSON, all of a person's data (every
branch of every conversation, their settings) as JSON, and the snapshot a shared link shows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from chat.branches import thread
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


def conversation_record(
    conversation: Conversation, *, every_branch: bool = False
) -> dict[str, Any]:
    """The conversation, its settings (the model picked for it, its system prompt) and its
    branch on show (the messages the page shows), root first. `every_branch`: the messages
    are all of them, every version of every answer and edit, oldest first, and
    `branch_on_show` lists the ids of the ones the page shows."""
    on_show = [e.message for e in thread(conversation)]
    everything = list(conversation.messages.all())  # prefetched by the account export
    mids = {m.pk: m.mid for m in everything}

    def exported(messages: list[Message]) -> list[dict[str, Any]]:
        return [message_record(m, mids.get(m.parent_id) if m.parent_id else None) for m in messages]

    record = {
        "id": str(conversation.id),
        "title": conversation.title,
        "pinned": conversation.pinned,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "created_at": _time(conversation.created_at),
        "updated_at": _time(conversation.updated_at),
        "messages": exported(on_show),
    }
    if every_branch:
        record["messages"] = exported(sorted(everything, key=lambda m: (m.created_at, m.pk)))
        record["branch_on_show"] = [m.mid for m in on_show]
    return record


def conversation_document(conversation: Conversation) -> dict[str, Any]:
    return {
        "format": "chatsite.conversation",
        "version": FORMAT_VERSION,
        "exported_at": _time(timezone.now()),
        "conversation": conversation_record(conversation),
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


def account_document(user: AbstractBaseUser, user_id: int) -> dict[str, Any]:
    """Everything of a person's: the account, their custom instructions, every conversation
    (its settings and every branch) and their feedback. A fixed number of queries, however
    many conversations."""
    conversations = Conversation.objects.filter(user_id=user_id).prefetch_related("messages")
    feedback = Feedback.objects.filter(user_id=user_id).select_related("message")
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
        "conversations": [conversation_record(c, every_branch=True) for c in conversations],
        "feedback": [
            {
                "message": f.message.mid,
                "vote": f.vote,
                "comment": f.comment,
                "updated_at": _time(f.updated_at),
            }
            for f in feedback
        ],
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
