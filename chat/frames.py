"""The server → client frames of the wire protocol (docs/protocol.md): JSON and htmx HTML."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from chat.models import Message
from chat.services import Exchange, ThreadEntry, entry_for


def chunk(mid: str, seq: int, text: str) -> str:
    return json.dumps({"type": "chunk", "mid": mid, "seq": seq, "text": text}, ensure_ascii=False)


def done(
    mid: str,
    seq: int,
    status: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    error: str = "",
    tokens_left: int | None = None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "done",
        "mid": mid,
        "seq": seq,
        "status": status,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }
    if error:
        payload["error"] = error
    if tokens_left is not None:
        payload["tokens_left"] = tokens_left  # today's quota left, for the usage meter
    return payload


def error(code: str, message: str, *, retry_after: int | None = None, **extra: Any) -> str:
    payload: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if retry_after is not None:
        payload["retry_after"] = retry_after
    payload.update(extra)
    return json.dumps(payload, ensure_ascii=False)


def ready(tier: str, model: str, instance: str, **extra: Any) -> str:
    return json.dumps(
        {"type": "ready", "tier": tier, "model": model, "instance": instance, **extra},
        ensure_ascii=False,
    )


def exchange_html(
    exchange: Exchange,
    *,
    target: str,
    watch: bool,
    entries: list[ThreadEntry] | None = None,
    answer_html: str = "",
) -> str:
    """The user's bubble and the assistant's empty shell, appended to the message list.

    With `entries` (an edit or a regeneration changed the branch on show) the whole thread
    replaces the list instead. `watch` marks a shell sent to a tab that did not ask: its
    stream.js resumes it from the log. `answer_html` is the answer when it has already finished
    by the time a watching tab hears of it.
    """
    return render_to_string(
        "chat/frames/exchange.html",
        {
            "conversation": exchange.conversation,
            "prompt": exchange.prompt,
            "answer": exchange.answer,
            "target": target,
            "watch": watch,
            "created": exchange.created,
            "entries": entries,
            "answer_html": answer_html,
        },
    )


async def final_message_html(message: Message) -> str:
    """The finished answer, rendered from markdown and sanitised, replacing the streamed text.

    It carries its place among its versions, so the "2 / 3" arrows stay on it.
    """
    # Rendering a long answer takes milliseconds, and finding its versions a query: both run
    # off the event loop.
    return await database_sync_to_async(final_message_html_sync)(message)


def final_message_html_sync(message: Message) -> str:
    """`final_message_html` for code already on the ORM thread."""
    entry = entry_for(message, render=True)
    return render_to_string(
        "chat/frames/final.html", {"message": message, "entry": entry, "rendered": entry.rendered}
    )
