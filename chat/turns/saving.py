"""The end of a turn on the ORM thread and off it: its answer saved, its HTML rendered."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import sync_to_async

from chat import conversations, fragments
from chat.limits.usage import add_usage
from chat.models import Message

log = logging.getLogger("chat.turns.turn")  # the turn's own log lines, as before the move


# A token count as stored (PositiveIntegerField: PostgreSQL's integer) and counted in Redis.
MAX_TOKENS_COUNTED = 2**31 - 1


def clamp_tokens(count: int) -> int:
    return min(max(0, count), MAX_TOKENS_COUNTED)


async def render_off_thread(mid: str, text: str) -> str | None:
    """Render the finished answer in a worker thread: pure CPU, so not on the one thread that
    serves every socket's database work. None if it fails (saved as not rendered, it is then
    rendered when shown)."""
    try:
        return await sync_to_async(fragments.answer_html, thread_sensitive=False)(text)
    except Exception:
        log.exception("turn %s could not render its answer", mid)
        return None


def save_answer(
    mid: str,
    save: dict[str, Any],
    *,
    usage: tuple[int, str, str, int, int] | None,
    blocks: int | None = None,
    only_version: bool = False,
) -> tuple[str | None, bool]:
    """Save a finished answer, add its usage to today's row, and make its final frame.

    One call on the ORM thread for the three: that thread is a queue every turn passes
    through. The answer's HTML comes rendered (off this thread); the frame only places it.
    Each part fails on its own (logged): an answer that could not be saved is marked failed
    with its last checkpoint once its lease runs out; usage that could not be recorded must
    not lose the answer. `only_version`: the answer is its prompt's only one (a turn that
    asked a new prompt), so its frame needs no versions query. Returns the final frame (None
    when there is nothing to show: the conversation was deleted meanwhile, or the save failed)
    and whether the answer is gone.
    """
    message: Message | None = None
    gone = False
    try:
        message = conversations.do_finish_message(mid, **save)
        gone = message is None
    except Exception:
        log.exception("turn %s could not save its answer", mid)
    if usage is not None:
        try:
            add_usage(*usage)
        except Exception:
            log.exception("turn %s could not record its usage", mid)
    if message is None:
        return None, gone
    try:
        return fragments.final_html(message, blocks=blocks, only_version=only_version), False
    except Exception:
        log.exception("turn %s could not make its final frame", mid)
        return None, False
