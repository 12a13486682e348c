"""What a user and a conversation set for their turns: the model picked for the conversation,
and the first `system` message (custom instructions, then the conversation's system prompt)."""

from __future__ import annotations

from django.db import connection

from chat.models import Conversation, Preferences


def system_message(user_id: int, conversation: Conversation | None) -> list[dict[str, str]]:
    """The first `system` message: the user's custom instructions, then the conversation's
    system prompt; none when both are empty. One query (the user's preferences)."""
    with connection.cursor() as cursor:
        cursor.execute(_instructions_sql(), (user_id,))
        row = cursor.fetchone()
    instructions = row[0] if row else None
    parts = [instructions or "", conversation.system_prompt if conversation else ""]
    text = "\n\n".join(part.strip() for part in parts if part and part.strip())
    return [{"role": "system", "content": text}] if text else []


_INSTRUCTIONS: dict[str, str] = {}


def _instructions_sql() -> str:
    """The user's custom instructions, written out once per database vendor: this runs on the
    ORM thread at every turn's start, and compiling the queryset took several times what the
    statement takes (docs/decisions/performance.md, issue 18)."""
    sql = _INSTRUCTIONS.get(connection.vendor)
    if sql is None:
        q = connection.ops.quote_name
        meta = Preferences._meta
        sql = _INSTRUCTIONS[connection.vendor] = (
            f"SELECT {q('instructions')} FROM {q(meta.db_table)} WHERE {q('user_id')} = %s"
        )
    return sql


def model_for(
    conversation: Conversation | None, default: str, picked: str | None, allowed: frozenset[str]
) -> str:
    """The model that answers: the one picked with this frame (remembered for the
    conversation), else the conversation's, while this connection may still use it, else the
    device tier's default."""
    if picked:
        if conversation is not None and conversation.model != picked:
            Conversation.objects.filter(pk=conversation.pk).update(model=picked)
            conversation.model = picked
        return picked
    if conversation is not None and conversation.model and conversation.model in allowed:
        return conversation.model
    return default
