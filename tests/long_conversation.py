"""A long conversation, stored fast: one bulk insert of a linear thread of prompts and answers.

In-process (`long_conversation(user, n)`) for the SQLite tests, and as a command for a real
server's database, SQLite or PostgreSQL alike (the ORM does both):

    DATABASE_URL=… python -m tests.long_conversation <username> <messages> [--no-leaf]
    # prints the id
"""

from __future__ import annotations

import sys
from typing import Any


def text_of(i: int) -> str:
    """Message i's text: its number, findable in a page (`message 00042.`), some markdown."""
    role = "prompt" if i % 2 == 0 else "answer"
    return f"{role} message {i:05d}. Some **bold** words so that it renders as markdown."


def long_conversation(
    user: Any, messages: int, *, title: str = "A long conversation", leaf: bool = True
) -> Any:
    """A conversation of `messages` messages (prompt, answer, prompt, …) ending at its leaf.
    Without `leaf`, as stored before conversations kept their leaf: the newest message is it."""
    # Imported here: as a command, Django is set up (main) before the models can be imported.
    from django.db import connection, transaction
    from django.db.models import Max
    from django.utils import timezone

    from chat.models import Conversation, Message

    with transaction.atomic():
        conversation = Conversation.objects.create(user=user, title=title)
        # Explicit ids, so that every message can name its parent in the same insert.
        base = (Message.objects.aggregate(top=Max("id"))["top"] or 0) + 1
        now = timezone.now()
        rows = []
        for i in range(messages):
            answer = i % 2 == 1
            text = text_of(i)
            rows.append(
                Message(
                    id=base + i,
                    mid=f"1700000000000-seed-{conversation.shard}-{base + i}",
                    conversation=conversation,
                    parent_id=base + i - 1 if i else None,
                    role=Message.Role.ASSISTANT if answer else Message.Role.USER,
                    text=text,
                    # A finished answer stores its HTML, as a turn does when it ends.
                    html=f"<p>{text.replace('**bold**', '<strong>bold</strong>')}</p>"
                    if answer
                    else "",
                    status=Message.Status.COMPLETE,
                    model="demo-full" if answer else "",
                    tier="full" if answer else "",
                    created_at=now,
                )
            )
        Message.objects.bulk_create(rows, batch_size=2000)
        if leaf:
            conversation.leaf_id = base + messages - 1
            conversation.save(update_fields=["leaf"])
        if messages and connection.vendor == "postgresql":
            # PostgreSQL's sequence must move past the explicit ids.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT setval(pg_get_serial_sequence('chat_message', 'id'), %s)",
                    [base + messages],
                )
    return conversation


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    username, messages = argv[0], int(argv[1])
    user = get_user_model().objects.get(username=username)
    print(long_conversation(user, messages, leaf="--no-leaf" not in argv).id)


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    main(sys.argv[1:])
