"""The server → client frames of the wire protocol (docs/protocol.md): JSON and htmx HTML."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django.template.loader import render_to_string

from chat.models import Message
from chat.rendering import render_markdown
from chat.services import Exchange, ThreadEntry


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
) -> str:
    """The user's bubble and the assistant's empty shell, appended to the message list.

    With `entries` (an edit or a regeneration changed the branch on show) the whole thread
    replaces the list instead. `watch` marks a shell sent to a tab that did not ask: its
    stream.js resumes it from the log.
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
        },
    )


async def final_message_html(message: Message) -> str:
    """The finished answer, rendered from markdown and sanitised, replacing the streamed text."""
    # Rendering a long answer takes milliseconds: keep it off the event loop.
    html = await asyncio.to_thread(render_markdown, message.text) if message.text else ""
    return render_to_string("chat/frames/final.html", {"message": message, "rendered": html})
