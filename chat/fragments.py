"""The HTML frames of the wire protocol (docs/protocol.md): server-rendered fragments that htmx
swaps out of band — a new exchange's bubbles, a finished answer."""

from __future__ import annotations

import json

from django.template.loader import render_to_string

from chat import protocol
from chat.branches import ThreadEntry, entry_for, rendered_html
from chat.bubbles import Live, esc, message_html
from chat.conversations import Exchange
from chat.menus import conversation_item_html, settings_menu_html, share_menu_html
from chat.models import Conversation, Message
from chat.rendering import render_markdown


def exchange_html(
    exchange: Exchange,
    *,
    target: str,
    watch: bool,
    answer_html: str = "",
    shown: bool = True,
) -> str:
    """The new messages of an exchange, appended to the message list: never the whole thread.

    A plain exchange appends the user's bubble and the assistant's empty shell. A fork (an
    edit, a regeneration) also says after which message the new branch goes on
    (`data-fork-after`): the page drops what followed that message, then appends; its new
    messages carry their "2 / 3" arrows (one query each, on the ORM thread). `watch` marks
    a shell sent to a tab that did not ask: its stream.js resumes it from the log.
    `answer_html` is the answer when it has already finished by the time a watching tab hears
    of it. Not `shown` (a tab showing another conversation), only a new conversation's sidebar
    entry: every fragment sent must find its target.
    """
    prompt_entry = answer_entry = None
    if shown and exchange.forked:
        if exchange.prompt is not None:
            prompt_entry = entry_for(exchange.prompt)
        else:
            answer_entry = entry_for(exchange.answer)
    out = ["\n"]
    if shown:
        # Its new messages, appended to `target` (the page's message list); a fork first drops
        # what followed `fork_after` on the page (thread.js), and brings "Load earlier
        # messages" when it forks after a message (chat/partials/earlier.html).
        fork_after = exchange.fork_after
        fork = "" if fork_after is None else f' data-fork-after="{esc(fork_after)}"'
        out.append(f"\n<div hx-swap-oob='beforeend:{esc(target)}'{fork}>\n  ")
        if fork_after:
            first = exchange.prompt or exchange.answer
            out.append(
                render_to_string(
                    "chat/partials/earlier.html",
                    {"conversation_id": exchange.conversation.id, "before": first.mid},
                )
            )
        out.append("\n  ")
        if exchange.prompt is not None:
            out.append(message_html(exchange.prompt, entry=prompt_entry))
        out.append("\n  ")
        out.append(
            message_html(exchange.answer, entry=answer_entry, watch=watch, rendered=answer_html)
        )
        out.append("\n</div>\n")
    out.append("\n")
    if exchange.created:
        # A new conversation: for the tab that asked, its id and its header's menus; for
        # every tab, its sidebar entry.
        conversation = exchange.conversation
        out.append("\n  ")
        if not watch:
            out.append(
                '<input type="hidden" name="conversation" id="conversation-id"'
                f' value="{esc(conversation.id)}" hx-swap-oob="true">\n  '
                + settings_menu_html(conversation, oob=True)
                + "\n  "
                + share_menu_html(conversation, oob=True)
            )
        out.append(
            '\n  <div hx-swap-oob="afterbegin:#conversation-list">'
            f"{conversation_item_html(conversation, '')}</div>\n"
        )
    out.append("\n")
    return "".join(out)


def continuation_html(
    message: Message,
    html: str,
    *,
    next_seq: int,
    watch: bool,
    opened: tuple[int, int, str] | None = None,
) -> str:
    """An answer going on (Continue): it replaces the finished answer out of band, streaming
    again, showing what it said so far; `next_seq` is the seq its next chunk has (the page's
    reorder buffer starts there), `watch` marks it for a tab that did not ask.

    `opened` (placed, end, text): `html` is the first `placed` blocks of the answer, covering
    its text up to `end` (code points), and `text` is the rest, its open block, which the page
    previews and the continuation extends (docs/protocol.md, *Continue*). Pure template work:
    no query."""
    live = None
    if opened is not None:
        placed, end, text = opened
        # JSON keeps a "\r" a "\r": the HTML parser would make it "\n", and offsets count it.
        live = Live(placed, end, json.dumps(text))
    return message_html(message, rendered=html, oob=True, watch=watch, next_seq=next_seq, live=live)


def title_html(user_id: int, conversation_id: str, *, showing: str) -> str:
    """A conversation's new title for a tab: its sidebar entry, and the chat's header when the
    tab shows it (both out of band). "" if the conversation is gone. Runs a query."""
    conversation = Conversation.objects.filter(pk=conversation_id, user_id=user_id).first()
    if conversation is None:
        return ""
    return render_to_string(
        "chat/frames/title.html",
        {"c": conversation, "current": showing, "shown": showing == str(conversation.id)},
    )


def answer_html(text: str) -> str:
    """A finished answer's body as sanitised HTML: what Message.html stores, rendered once
    when the answer ends. Pure CPU: call it off the ORM thread (sync_to_async with
    thread_sensitive=False), never once per tab."""
    return render_markdown(text) if text else ""


def final_html(message: Message, *, blocks: int | None = None, only_version: bool = False) -> str:
    """A finished answer's HTML frame, replacing the streamed text: its stored HTML.

    It carries its place among its versions, so the "2 / 3" arrows stay on it. `blocks`: the
    HTML is exactly the answer's `block` frames joined, this many (the body says so in
    `data-blocks`, and a tab that shows those blocks keeps its body as it is). Runs a query
    (the versions): call it on the ORM thread (database_sync_to_async). `only_version`: the
    caller knows the answer has no other version (the answer of a prompt its turn asked, which
    no regeneration can fork while it streams), so no query asks.
    """
    if only_version:
        # Its HTML as stored; rendered (and stored: a query) only if its rendering failed.
        entry = ThreadEntry(message, 1, 1, "", "", rendered_html(message))
    else:
        entry = entry_for(message, render=True)
    return (
        "\n"
        + message_html(message, entry=entry, rendered=entry.rendered, oob=True, blocks=blocks)
        + "\n"
    )


def done_of(message: Message, *, tokens_left: int | None = None) -> str:
    """The `done` frame of a finished answer, from what was saved."""
    return protocol.dumps(
        protocol.done(
            message.mid,
            message.chunk_count,
            message.status,
            message.prompt_tokens,
            message.completion_tokens,
            error=message.error,
            tokens_left=tokens_left,
        )
    )


def finished(message: Message, *, html: str | None = None) -> list[str]:
    """The frames that end an answer for a tab that did not see its turn end: the final HTML,
    then its `done`. Call it on the ORM thread unless `html` is given."""
    return [final_html(message) if html is None else html, done_of(message)]
