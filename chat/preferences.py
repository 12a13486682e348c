"""What a user and a conversation set for their turns: the model picked for the conversation,
and the first `system` message (custom instructions, then the conversation's system prompt)."""

from __future__ import annotations

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper

from chat.models import Conversation, Preferences


def system_message(user_id: int, conversation: Conversation | None) -> list[dict[str, str]]:
    """The first `system` message: the user's custom instructions, then the conversation's
    system prompt; none when both are empty. One query (the user's preferences)."""
    return system_message_from(custom_instructions(user_id), conversation)


def custom_instructions(user_id: int) -> str | None:
    """The user's custom instructions (None: no preferences row). One query."""
    with connection.cursor() as cursor:
        cursor.execute(_instructions_sql(), (user_id,))
        row = cursor.fetchone()
    return row[0] if row else None


def system_message_from(
    instructions: str | None, conversation: Conversation | None
) -> list[dict[str, str]]:
    """`system_message` given the user's custom instructions (None: no preferences row), read
    by the caller in a statement it runs anyway (a turn's start, chat/conversations.py)."""
    parts = [instructions or "", conversation.system_prompt if conversation else ""]
    text = "\n\n".join(part.strip() for part in parts if part and part.strip())
    return [{"role": "system", "content": text}] if text else []


_INSTRUCTIONS: dict[str, str] = {}


def instructions_subquery(db: BaseDatabaseWrapper) -> str:
    """The user's custom instructions as a scalar subquery (one parameter, the user's id), for a
    statement that reads them beside something else (NULL: the user has no preferences)."""
    return f"({_instructions_sql(db)})"


def _instructions_sql(db: BaseDatabaseWrapper | None = None) -> str:
    """The user's custom instructions, written out once per database vendor: this runs on the
    ORM thread at every turn's start, and compiling the queryset took several times what the
    statement takes (docs/decisions/performance.md, issue 18)."""
    db = db or connection
    sql = _INSTRUCTIONS.get(db.vendor)
    if sql is None:
        q = db.ops.quote_name
        meta = Preferences._meta
        sql = _INSTRUCTIONS[db.vendor] = (
            f"SELECT {q('instructions')} FROM {q(meta.db_table)} WHERE {q('user_id')} = %s"
        )
    return sql


def model_for(
    conversation: Conversation | None, default: str, picked: str | None, allowed: frozenset[str]
) -> str:
    """The model that answers: the one picked with this frame (remembered for the
    conversation), else the conversation's, while this connection may still use it, else the
    device tier's default."""
    if picked and conversation is not None and conversation.model != picked:
        Conversation.objects.filter(pk=conversation.pk).update(model=picked)
        conversation.model = picked
    return chosen_model(conversation, default, picked, allowed)


def chosen_model(
    conversation: Conversation | None, default: str, picked: str | None, allowed: frozenset[str]
) -> str:
    """`model_for` without remembering the pick: for a caller that stores the conversation's
    `model` itself, in a statement it runs anyway (a turn's start, chat/conversations.py)."""
    if picked:
        return picked
    if conversation is not None and conversation.model and conversation.model in allowed:
        return conversation.model
    return default
