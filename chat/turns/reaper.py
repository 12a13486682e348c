"""Answers whose turn is gone (its instance stopped or died) are marked failed, with their text.

A dead turn leaves three things behind: its last checkpoint in the database (every
CHAT_CHECKPOINT_SECONDS), its stream log (every chunk it sent, on Redis), and what the limiter
held for it (a stream slot, a token reservation). Reaping keeps the longer text — the tabs
were shown everything in the log, the checkpoint may lag it by seconds — renders it once,
marks the answer failed with the usage it can tell (the prompt its admission recorded, the
kept text estimated), releases the slot and the reservation and counts what was delivered
(in the quota and the Usage history, as a live turn that fails is counted), and ends the
stream log with the answer's `done`, so every tab following it, on any instance, is told at
once.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from chat import conversations, fragments, protocol
from chat.limits.limiter import get_limiter
from chat.limits.usage import add_usage
from chat.models import Message
from chat.tokens import estimate_tokens
from chat.turns.saving import clamp_tokens
from chat.turns.streamlog import StreamLogUnavailable, get_stream_log

log = logging.getLogger(__name__)


async def reap(*, instance: str | None = None, mid: str | None = None) -> int:
    """Mark orphaned answers failed: those `instance` owned (at its start), the one `mid` if
    its lease ran out, or every one whose lease ran out. Returns how many."""
    orphans = await database_sync_to_async(conversations.orphans_to_reap)(
        instance=instance, mid=mid
    )
    reaped = 0
    for orphan in orphans:
        try:
            reaped += await _reap_one(orphan)
        except Exception:
            # One orphan that cannot be reaped now must not keep the others streaming; the
            # next round tries it again.
            log.exception("could not reap the interrupted answer %s", orphan.mid)
    return reaped


async def _reap_one(orphan: conversations.Orphan) -> int:
    text, chunk_count = await _longest_text(orphan)
    html = await sync_to_async(fragments.answer_html, thread_sensitive=False)(text)
    usage = _dead_turn_usage(orphan.admission, text)
    message = await database_sync_to_async(_mark_reaped)(
        orphan, text=text, chunk_count=chunk_count, html=html, usage=usage
    )
    if message is None:
        return 0  # someone else reaped it, or its turn finished after all
    if orphan.admission is not None:
        await get_limiter().release_dead(orphan.user_id, orphan.admission, usage.charged or None)
    await _end_stream_log(message)
    log.warning(
        "marked the interrupted answer %s failed (%d characters, %d from the stream log)",
        orphan.mid,
        len(text),
        len(text) - len(orphan.text),
    )
    return 1


class DeadTurnUsage(NamedTuple):
    """What a dead turn used, as far as the reaper can tell: the prompt it sent (known from its
    admission record), the text it added estimated (chat.tokens), and what is charged for it."""

    prompt_tokens: int
    completion_tokens: int
    charged: int


def _dead_turn_usage(admission: dict[str, Any] | None, text: str) -> DeadTurnUsage:
    """The text it added is what follows `base_chars` (a continuation's earlier text was counted
    by its own turn). As a live turn that fails is charged (Turn._charged): the prompt as sent
    and the text added, or nothing when it added nothing."""
    record = admission or {}
    try:
        prompt, base = max(0, int(record.get("prompt_tokens", 0))), int(record.get("base_chars", 0))
    except (TypeError, ValueError):
        prompt, base = 0, 0
    added = text[max(0, base) :]
    completion = estimate_tokens(added)
    return DeadTurnUsage(prompt, completion, prompt + completion if added else 0)


def _mark_reaped(
    orphan: conversations.Orphan, *, text: str, chunk_count: int, html: str, usage: DeadTurnUsage
) -> Message | None:
    """One ORM trip: mark the answer failed with its usage, and add what is charged to the
    user's Usage history for today, as a live turn's end does (saving.save_answer)."""
    message = conversations.do_reap(
        orphan.mid,
        text=text,
        chunk_count=chunk_count,
        html=html,
        prompt_tokens=clamp_tokens(usage.prompt_tokens),
        completion_tokens=clamp_tokens(usage.completion_tokens),
    )
    if message is not None and usage.charged:
        try:
            add_usage(
                orphan.user_id,
                message.model,
                message.tier,
                clamp_tokens(usage.prompt_tokens),
                clamp_tokens(usage.completion_tokens),
            )
        except Exception:
            log.exception("could not record the usage of the interrupted answer %s", orphan.mid)
    return message


async def _longest_text(orphan: conversations.Orphan) -> tuple[str, int]:
    """The checkpoint's text, continued by the chunks the stream log holds after it."""
    try:
        tail = await get_stream_log().chunks(orphan.mid, orphan.chunk_count - 1)
    except StreamLogUnavailable as exc:
        log.warning("reaping %s from its checkpoint only: %s", orphan.mid, exc)
        return orphan.text, orphan.chunk_count
    parts, count = [orphan.text], orphan.chunk_count
    for chunk in tail:
        if chunk.seq != count:
            break  # a gap (entries dropped while Redis was away): the rest would not join
        parts.append(chunk.text)
        count += 1
    return "".join(parts), count


async def _end_stream_log(message: Message) -> None:
    """Write the answer's `done` to its stream log: followers anywhere end it now."""
    payload = protocol.done(
        message.mid,
        message.chunk_count,
        message.status,
        message.prompt_tokens,
        message.completion_tokens,
        error=message.error,
    )
    try:
        await get_stream_log().finish(message.mid, payload)
    except Exception:
        log.exception("could not end the stream log of the interrupted answer %s", message.mid)
