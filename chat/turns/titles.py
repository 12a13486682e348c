"""A new conversation's title, written by the lite model once its first answer completes (the
first turn, or the Continue that completes a stopped or cut first answer): in the background
(never delaying the answer), admitted and counted like a small turn, the prompt's first words
on any failure, and never over a title the user typed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

from channels.db import database_sync_to_async
from django.conf import settings

from chat.events import send_to_user
from chat.limits.budget import prompt_tokens
from chat.limits.limiter import Rejection, get_limiter
from chat.limits.usage import add_usage
from chat.models import Conversation, Message
from chat.tiers.policy import LITE, aload_policy
from chat.tokens import estimate_tokens
from chat.turns.model_client import get_client
from chat.turns.turn import Turn
from chat.upstream.items import Delta, Usage

log = logging.getLogger(__name__)

# The demo model answers a request whose system message starts so with a title (protocol.md).
TITLE_INSTRUCTION = (
    "Write a short title (at most six words) for a conversation that starts with the user's "
    "message below. Reply with the title only: no quotes, no full stop."
)
TITLE_MAX_TOKENS = 20
TITLE_MAX_CHARS = 60
PROMPT_CHARS = 1000  # of the first prompt, sent for its title
TITLE_TIMEOUT_SECONDS = 20.0
FALLBACK_WORDS = 6
# What a model may wrap a title in: quotes (straight and curly), backticks, markdown.
QUOTES = " \"'`*#\u201c\u201d\u2018\u2019"

_running: set[asyncio.Task[None]] = set()  # kept referenced until they end


def fallback_title(prompt: str) -> str:
    """The prompt's first words: the title when the model cannot give one."""
    words = prompt.split()
    title = " ".join(words[:FALLBACK_WORDS])[:TITLE_MAX_CHARS].strip()
    return title + ("…" if len(words) > FALLBACK_WORDS else "") if title else "New chat"


def clean_title(text: str) -> str:
    """The model's answer as a title: its first line, without quotes, a "Title:" label or a
    full stop; "" when nothing is left."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    line = re.sub(r"^(title\s*:\s*)", "", line, flags=re.IGNORECASE)
    line = line.strip(QUOTES).rstrip(".").strip()
    return " ".join(line.split())[:TITLE_MAX_CHARS].strip()


def schedule(turn: Turn, *, conversation_id: str, prompt: str) -> None:
    """Title the conversation once its first answer (`turn`, which may be a Continue of it) has
    ended complete."""
    if not settings.CHAT_TITLES:
        return
    task = asyncio.get_running_loop().create_task(
        _after(turn, conversation_id, prompt), name=f"title {conversation_id}"
    )
    _running.add(task)
    task.add_done_callback(_running.discard)


async def _after(turn: Turn, conversation_id: str, prompt: str) -> None:
    if turn.task is not None:
        with contextlib.suppress(BaseException):
            await asyncio.shield(turn.task)
    if turn.status != Message.Status.COMPLETE:
        return  # a stopped or failed first answer keeps the provisional title
    try:
        await title_conversation(turn.user_id, conversation_id, prompt)
    except Exception:
        log.exception("could not title conversation %s", conversation_id)


async def title_conversation(user_id: int, conversation_id: str, prompt: str) -> str | None:
    """Ask the lite model for a title (within the user's limits), save it unless the user
    renamed the conversation, and tell every tab of the user. Returns the title saved."""
    asked, tokens_left = await _ask_for_title(user_id, prompt)
    title = asked or fallback_title(prompt)
    saved = await database_sync_to_async(_save_title)(user_id, conversation_id, title)
    if not saved:
        return None
    event = {"type": "chat.title", "conversation": conversation_id, "title": title}
    # Its tokens were counted after the answer's `done`: the usage meters learn what is left.
    await send_to_user(user_id, {**event, "tokens_left": tokens_left})
    return title


async def _ask_for_title(user_id: int, prompt: str) -> tuple[str, int | None]:
    """The lite model's title ("" if refused by a limit or on any error), and today's tokens
    left once it is counted (None: unknown, or no budget)."""
    messages = [
        {"role": "system", "content": TITLE_INSTRUCTION},
        {"role": "user", "content": prompt[:PROMPT_CHARS]},
    ]
    want = prompt_tokens(messages) + TITLE_MAX_TOKENS
    # Within the user's limits, but not one of their messages and not in one of their stream
    # slots: a title must not make the user's next prompt run into the rate limit or the
    # stream cap (it is asked for right after an answer, when the next prompt may come).
    admission = await get_limiter().admit(user_id, estimate_tokens=want, pool="titles")
    if isinstance(admission, Rejection):
        log.info("title of a conversation of user %s refused: %s", user_id, admission.code)
        return "", None
    model = (await aload_policy()).model_for(LITE).model
    text, usage, tokens_left = "", None, None
    try:
        async with asyncio.timeout(TITLE_TIMEOUT_SECONDS):
            stream = get_client().stream_chat(
                model=model, messages=messages, max_tokens=TITLE_MAX_TOKENS
            )
            async with contextlib.aclosing(stream):
                async for item in stream:
                    if isinstance(item, Delta):
                        text += item.text.replace("\x00", "")
                        if len(text) > TITLE_MAX_CHARS * 4:
                            break  # a server that ignores max_tokens
                    elif isinstance(item, Usage):
                        usage = item
    except Exception as exc:  # timeouts and upstream errors alike: the fallback title
        log.warning("title request failed: %s", exc)
        text = ""
    finally:
        used_prompt = usage.prompt_tokens if usage else prompt_tokens(messages)
        used_answer = usage.completion_tokens if usage else estimate_tokens(text)
        used = max(0, used_prompt) + max(0, used_answer)
        tokens_left = await admission.settle(used)
        with contextlib.suppress(Exception):
            await database_sync_to_async(add_usage)(
                user_id, model, LITE, max(0, used_prompt), max(0, used_answer)
            )
    return clean_title(text), tokens_left


def _save_title(user_id: int, conversation_id: str, title: str) -> bool:
    # Renaming by hand wins: a title the user typed is never replaced.
    return bool(
        Conversation.objects.filter(
            pk=conversation_id, user_id=user_id, title_by_hand=False
        ).update(title=title)
    )
