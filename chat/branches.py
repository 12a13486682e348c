"""Reads of the message tree: the branch on show a window at a time, its messages' versions, and
the history a turn may send, each in a bounded number of queries however long the thread."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Prefetch, prefetch_related_objects

from chat.models import Conversation, Feedback, Message
from chat.rendering import render_markdown

# At most this many messages go upstream, however short they are: the context is also trimmed
# to LLM_CONTEXT_CHARS, and this bounds the walk when the messages are tiny.
HISTORY_MAX_MESSAGES = 500

_TABLE = Message._meta.db_table

# Walk up from one message through its parents (a recursive CTE: SQLite and PostgreSQL alike),
# at most `limit` steps. `chars` sums the texts walked so far, starting from `extra`, so a walk
# for the history can stop once the model's context is full. Types are fixed with CAST because
# PostgreSQL wants the same type in both halves of the recursion.
_WALK_UP = f"""
WITH RECURSIVE up(id, parent_id, depth, chars) AS (
    SELECT id, parent_id, 1, CAST(%s + LENGTH(text) AS BIGINT) FROM {_TABLE} WHERE id = ({{start}})
    UNION ALL
    SELECT m.id, m.parent_id, up.depth + 1, CAST(up.chars + LENGTH(m.text) AS BIGINT)
    FROM {_TABLE} m JOIN up ON m.id = up.parent_id
    WHERE up.depth < %s AND up.chars <= %s
)
"""

# Walk down from one message, always to its newest reply, to the end of that branch.
_WALK_DOWN = f"""
WITH RECURSIVE down(id, depth) AS (
    SELECT CAST(%s AS BIGINT), 0
    UNION ALL
    SELECT (SELECT c.id FROM {_TABLE} c WHERE c.parent_id = down.id
            ORDER BY c.created_at DESC, c.id DESC LIMIT 1), down.depth + 1
    FROM down WHERE down.id IS NOT NULL
)
SELECT id FROM down WHERE id IS NOT NULL ORDER BY depth DESC LIMIT 1
"""


@dataclass(frozen=True)
class ThreadEntry:
    """A message on the branch on show, and where it stands among its versions."""

    message: Message
    version: int  # 1-based
    versions: int
    previous: str  # mid of the previous version, "" if none
    next: str
    rendered: str = ""  # the finished answer as sanitised HTML, when asked for


@dataclass(frozen=True)
class Window:
    """A stretch of the branch on show, root first, and where the stretch above it ends.

    `earlier` is the mid of the first message when messages come before it ("" at the root):
    "Load earlier messages" asks for the window before it.
    """

    entries: list[ThreadEntry]
    earlier: str = ""


def rendered_html(message: Message, *, store: bool = True) -> str:
    """A finished answer as sanitised HTML (as stored when it ended); empty for prompts and
    streaming answers. An answer not rendered yet (NULL: saved before its HTML was stored, or
    its rendering failed) is rendered here and stored (`store=False`: the caller stores it),
    so it is rendered once, not per page load; "" is stored HTML like any other (an answer
    that renders to nothing, issue 19's review, finding 1)."""
    finished = message.role == Message.Role.ASSISTANT and message.status != Message.Status.STREAMING
    if not finished:
        return ""
    if message.html is not None:
        return message.html
    rendered = render_markdown(message.text) if message.text else ""
    message.html = rendered
    if store:
        # Only where it is still not rendered: a turn that finished meanwhile wrote its own.
        Message.objects.filter(pk=message.pk, html__isnull=True).update(html=rendered)
    return rendered


def _leaf_sql(conversation: Conversation) -> tuple[str, tuple[Any, ...]]:
    """SQL for the id of the branch's last message: the conversation's leaf, or (before leaves
    were stored) its newest message."""
    if conversation.leaf_id is not None:
        return "%s", (conversation.leaf_id,)
    newest = Message.objects.filter(conversation_id=conversation.pk).order_by("-created_at", "-id")
    sql, params = newest.values("id")[:1].query.sql_with_params()
    return sql, tuple(params)


def path_up(
    conversation: Conversation, *, before: Message | None = None, size: int
) -> list[Message]:
    """Up to `size` messages of the branch on show, root first: those that end at its leaf, or
    with `before`, those just above that message. One query."""
    if before is not None:
        if before.parent_id is None:
            return []
        start: tuple[str, tuple[Any, ...]] = ("%s", (before.parent_id,))
    else:
        start = _leaf_sql(conversation)
    sql = (
        _WALK_UP.format(start=start[0])
        + f"SELECT m.*, up.depth AS walk_depth FROM {_TABLE} m JOIN up ON m.id = up.id"
        + " ORDER BY up.depth DESC"
    )
    # No char budget for a window: `chars` only grows, so a budget above any sum never stops it.
    never = 2**62
    params = (0, *start[1], size, never)
    return list(Message.objects.raw(sql, params))


def entries_of(
    path: list[Message], *, render: bool = False, votes_of: int | None = None
) -> list[ThreadEntry]:
    """The messages of a stretch of the branch with their places among their versions: one
    query for every version of every message in the stretch. With `render`, finished answers
    come with their HTML; with `votes_of` (the owner's user id), each message with that
    person's 👍/👎 (`votes`, at most one), one more query, for the feedback controls."""
    if not path:
        return []
    if votes_of is not None:
        votes = Feedback.objects.filter(user_id=votes_of)
        prefetch_related_objects(path, Prefetch("feedback", votes, to_attr="votes"))
    versions = _versions(path[0].conversation_id, {m.parent_id for m in path})
    # Answers not rendered yet are rendered here once and stored in one statement for all.
    unrendered = [m for m in path if render and m.html is None]
    for m in unrendered:
        rendered_html(m, store=False)
    unrendered = [m for m in unrendered if m.html is not None]  # prompts, streaming: not now
    if len(unrendered) == 1:  # one statement, no transaction (an answer's final frame)
        m = unrendered[0]
        Message.objects.filter(pk=m.pk, html__isnull=True).update(html=m.html)
    elif unrendered:
        Message.objects.bulk_update(unrendered, ["html"])
    entries = []
    for m in path:
        mids = versions.get((m.parent_id, m.role), [m.mid])
        i = mids.index(m.mid) if m.mid in mids else 0
        entries.append(
            ThreadEntry(
                m,
                i + 1,
                max(1, len(mids)),
                mids[i - 1] if i > 0 else "",
                mids[i + 1] if i + 1 < len(mids) else "",
                rendered_html(m) if render else "",
            )
        )
    return entries


def _versions(
    conversation_id: Any, parents: Iterable[int | None]
) -> dict[tuple[Any, str], list[str]]:
    """The mids of the replies to each of `parents`, by role, oldest first."""
    parents = set(parents)
    ids = [p for p in parents if p is not None]
    # Replies to a message are in its conversation: only the first prompt's versions need the
    # conversation to find them (the index on conversation and parent). Written out: this runs
    # for every finished answer's final frame, and compiling the queryset took several times
    # what the statement takes (docs/decisions/performance.md, issue 18).
    q = connection.ops.quote_name
    conditions, params = [], list(ids)
    if ids:
        conditions.append(f"{q('parent_id')} IN ({', '.join(['%s'] * len(ids))})")
    if None in parents:
        conditions.append(f"({q('conversation_id')} = %s AND {q('parent_id')} IS NULL)")
        # As the column stores it (a UUID is hex without dashes on SQLite).
        params.append(Conversation._meta.pk.get_db_prep_value(conversation_id, connection))
    if not conditions:
        return {}
    sql = (
        f"SELECT {q('parent_id')}, {q('role')}, {q('mid')} FROM {_TABLE} "
        f"WHERE {' OR '.join(conditions)} ORDER BY {q('created_at')}, {q('id')}"
    )
    versions: dict[tuple[Any, str], list[str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for parent_id, role, mid in cursor.fetchall():
            versions.setdefault((parent_id, role), []).append(mid)
    return versions


def window(
    conversation: Conversation,
    *,
    before: Message | None = None,
    size: int | None = None,
    render: bool = True,
) -> Window:
    """The latest `size` messages of the branch on show (CHAT_THREAD_WINDOW), or the `size`
    before `before`. Two queries whatever the length of the thread."""
    path = path_up(conversation, before=before, size=size or settings.CHAT_THREAD_WINDOW)
    earlier = path[0].mid if path and path[0].parent_id is not None else ""
    votes_of = conversation.user_id if render else None
    return Window(entries_of(path, render=render, votes_of=votes_of), earlier)


def entry_for(message: Message, *, render: bool = False) -> ThreadEntry:
    """One message as a ThreadEntry (its place among its versions), without the whole thread."""
    return entries_of([message], render=render)[0]


def history_to(message_id: int | None, *, extra_chars: int, budget: int) -> list[dict[str, str]]:
    """The branch that ends at `message_id` as chat messages, root first, for the model: only
    as far back as can fit `budget` characters after the `extra_chars` still to come (and at
    most HISTORY_MAX_MESSAGES). turns.history trims it exactly; this bounds what is read."""
    if message_id is None:
        return []
    sql = (
        _WALK_UP.format(start="%s")
        + f"SELECT m.role, m.text FROM {_TABLE} m JOIN up ON m.id = up.id ORDER BY up.depth DESC"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, (extra_chars, message_id, HISTORY_MAX_MESSAGES, budget))
        rows = cursor.fetchall()
    return [{"role": role, "content": text} for role, text in rows if text]


def newest_leaf_below(message: Message) -> int:
    """The id of the last message of the branch that goes on from `message` by its newest
    replies (the version arrows show that one). One query."""
    with connection.cursor() as cursor:
        cursor.execute(_WALK_DOWN, (message.pk,))
        row = cursor.fetchone()
    return int(row[0]) if row else message.pk


def thread(conversation: Conversation, *, render: bool = False) -> list[ThreadEntry]:
    """The whole branch on show, root first: for exports, never a page (it is as long as the
    conversation). One query (none when the conversation's messages were prefetched, as the
    account export does), then a walk up from the leaf in Python. With `render`, finished
    answers come with their HTML and each message with its owner's vote (one more query)."""
    messages: list[Message] = list(conversation.messages.all())
    if render and messages:
        votes = Feedback.objects.filter(user_id=conversation.user_id)
        prefetch_related_objects(messages, Prefetch("feedback", votes, to_attr="votes"))
    if not messages:
        return []
    by_id = {m.pk: m for m in messages}
    siblings: dict[tuple[int | None, str], list[str]] = {}
    for m in messages:  # created order, so each version list is oldest first
        siblings.setdefault((m.parent_id, m.role), []).append(m.mid)
    leaf = by_id.get(conversation.leaf_id or -1) or messages[-1]
    path: list[Message] = []
    node: Message | None = leaf
    while node is not None:
        path.append(node)
        node = by_id.get(node.parent_id) if node.parent_id else None
    path.reverse()
    entries = []
    for m in path:
        mids = siblings[(m.parent_id, m.role)]
        i = mids.index(m.mid)
        entries.append(
            ThreadEntry(
                m,
                i + 1,
                len(mids),
                mids[i - 1] if i > 0 else "",
                mids[i + 1] if i + 1 < len(mids) else "",
                rendered_html(m) if render else "",
            )
        )
    return entries


def leaf_id(conversation: Conversation) -> int | None:
    """The id of the branch's last message (None: no message yet). A query only for a
    conversation stored before leaves were."""
    if conversation.leaf_id is not None:
        return conversation.leaf_id
    newest = conversation.messages.order_by("-created_at", "-id").values_list("id", flat=True)
    return newest.first()


# A version switch shows the new branch from its leaf up to the switched message, so that the
# message stays where it was on screen, if it is at most this many windows up; farther, the
# page shows the latest window of the new branch (and "Load earlier messages").
SWITCH_REACH_WINDOWS = 4
# Messages shown above the switched one, for context.
SWITCH_CONTEXT = 5


def window_reaching(conversation: Conversation, mid: str, *, size: int | None = None) -> Window:
    """The branch on show from its leaf up to the message `mid` (and a few above it), when that
    is at most SWITCH_REACH_WINDOWS windows; else the latest window. Two queries."""
    size = size or settings.CHAT_THREAD_WINDOW
    path = path_up(conversation, size=size * SWITCH_REACH_WINDOWS)
    at = next((i for i, m in enumerate(path) if m.mid == mid), None)
    start = max(0, len(path) - size)
    if at is not None:
        start = min(max(0, at - SWITCH_CONTEXT), start)
    path = path[start:]
    earlier = path[0].mid if path and path[0].parent_id is not None else ""
    return Window(entries_of(path, render=True, votes_of=conversation.user_id), earlier)


def on_branch(conversation: Conversation, message_id: int) -> bool:
    """Whether the message is on the branch on show (an ancestor of its leaf, or the leaf).
    One query; the database walks up from the leaf until it meets the message."""
    leaf_sql, leaf_params = _leaf_sql(conversation)
    sql = f"""
WITH RECURSIVE up(id, parent_id) AS (
    SELECT id, parent_id FROM {_TABLE} WHERE id = ({leaf_sql})
    UNION ALL
    SELECT m.id, m.parent_id FROM {_TABLE} m JOIN up ON m.id = up.parent_id WHERE up.id <> %s
)
SELECT 1 FROM up WHERE id = %s
"""
    with connection.cursor() as cursor:
        cursor.execute(sql, (*leaf_params, message_id, message_id))
        return cursor.fetchone() is not None
