"""Concurrent follow-ups to one conversation chain, never fork it (PostgreSQL).

Two daphne instances can start turns of the same conversation at once (two tabs). Each start
reads the conversation's leaf as the new prompt's parent and then moves the leaf: without a
lock both read the same leaf, and one prompt shows up as a "version" of the other. On
PostgreSQL the start locks the conversation row (`SELECT ... FOR UPDATE`), so the second waits
and chains after the first. SQLite serialises writers (and has no FOR UPDATE): this test runs
only with DATABASE_URL=postgres://…, where each thread has its own real connection.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from chat import conversations
from chat.models import Message

pytestmark = [
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="needs concurrent writers (PostgreSQL)"
    ),
]

THREADS = 6
ROUNDS = 3


def _start(owner_pk: int, conversation_id: str, text: str) -> Any:
    return conversations.do_start_exchange(
        owner_pk, conversation_id, text, model="demo-full", tier="full"
    )


def test_concurrent_follow_ups_form_one_chain(owner: Any) -> None:
    first = _start(owner.pk, "", "first")
    conv_id = str(first.conversation.pk)
    errors: list[BaseException] = []

    for round_ in range(ROUNDS):
        barrier = threading.Barrier(THREADS)

        def turn(i: int, round_: int = round_, barrier: threading.Barrier = barrier) -> None:
            try:
                barrier.wait(timeout=30)
                _start(owner.pk, conv_id, f"r{round_} t{i}")
            except BaseException as e:  # reported below, after the threads end
                errors.append(e)
            finally:
                connections.close_all()  # this thread's own connection

        threads = [threading.Thread(target=turn, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
    assert errors == []

    first.conversation.refresh_from_db()
    messages = list(Message.objects.filter(conversation=first.conversation))
    assert len(messages) == 2 * (1 + THREADS * ROUNDS)  # every turn stored (none failed)
    children: dict[int | None, list[int]] = {}
    for m in messages:
        children.setdefault(m.parent_id, []).append(m.pk)
    forks = {parent: kids for parent, kids in children.items() if len(kids) > 1}
    assert forks == {}  # each message has at most one child: one chain, no "versions"
    # The chain from the root runs through every message and ends at the leaf.
    node, seen = children[None][0], 0
    while True:
        seen += 1
        if node not in children:
            break
        node = children[node][0]
    assert seen == len(messages)
    assert first.conversation.leaf_id == node
    # Prompts and answers alternate along it: each prompt's answer follows it directly.
    by_pk = {m.pk: m for m in messages}
    roles = []
    node = children[None][0]
    while True:
        roles.append(by_pk[node].role)
        if node not in children:
            break
        node = children[node][0]
    assert roles == [Message.Role.USER, Message.Role.ASSISTANT] * (1 + THREADS * ROUNDS)
