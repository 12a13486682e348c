"""Continue: a stopped, cut or length-limited answer goes on in the same message. Checking and
reopening it, the history that asks the model to go on, and the chunks it already has."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chat import branches, conversations, fragments
from chat.models import Conversation, Message
from chat.preferences import system_message
from chat.tokens import chars_to_tokens
from chat.turns.streamlog import StreamLogUnavailable, get_stream_log
from chat.upstream.items import Usage

NOT_CONTINUABLE = "Only a stopped, cut or length-limited answer can be continued."
NOT_LAST = "Only the conversation's last answer can be continued: ask again below, or Regenerate."
ALREADY = "That answer is already going on."


@dataclass(frozen=True)
class Reopened:
    """An answer reopened for its continuation, as it was before."""

    answer: Message
    conversation: Conversation
    history: list[dict[str, str]]
    html: str  # its rendered text, which the continuation's shell keeps showing
    text: str
    chunk_count: int
    usage: Usage  # the prompt and completion tokens it had used
    prompt: Message  # the prompt it answers
    was: str  # its status before: stopped, failed (cut) or complete (length-limited)

    @property
    def never_titled(self) -> bool:
        """An answer to the conversation's first prompt that never completed: the title that
        follows a first answer was never made, so this continuation's completion makes it."""
        return self.prompt.parent_id is None and self.was != Message.Status.COMPLETE


def do_continue(
    user_id: int,
    mid: str,
    *,
    model: str,
    tier: str,
    allowed: frozenset[str],
    admission: dict[str, Any] | None,
) -> Reopened:
    """Reopen the user's answer `mid` for its continuation: streaming again, with a lease and
    the admission of its turn; exactly once (a second Continue meanwhile is refused).

    The history is the branch up to its prompt, then the partial answer as the last
    (assistant) message: the model goes on from it. The answer keeps its model while this
    connection may still use it, else the device tier's default goes on.
    """
    with transaction.atomic():
        answer = conversations.check_message(user_id, mid)
        if not answer.continuable:
            raise conversations.BadRequest(NOT_CONTINUABLE)
        prompt = answer.parent
        if prompt is None:
            raise conversations.BadRequest(NOT_CONTINUABLE)
        conversation = answer.conversation
        if branches.leaf_id(conversation) != answer.pk:  # (a None leaf: the newest message)
            # Going on with an answer that later exchanges follow would rewrite what they
            # were asked and answered from.
            raise conversations.BadRequest(NOT_LAST)
        before = branches.history_to(
            prompt.pk, extra_chars=len(answer.text), budget=settings.LLM_CONTEXT_CHARS
        )
        history = [*system_message(user_id, conversation), *before]
        if answer.text:
            history.append({"role": "assistant", "content": answer.text})
        html = branches.rendered_html(answer)
        if admission is not None:
            sent = min(sum(len(m["content"]) for m in history), settings.LLM_CONTEXT_CHARS)
            # What it sends, and where its own text starts: a reaper charges only what follows.
            admission = {
                **admission,
                "prompt_tokens": chars_to_tokens(sent),
                "base_chars": len(answer.text),
            }
        previous = answer.status
        answer.status = Message.Status.STREAMING
        answer.model = answer.model if answer.model in allowed else model
        answer.tier = tier
        answer.picked = answer.model != model
        answer.error = ""
        answer.owner = settings.CHAT_INSTANCE_ID
        answer.lease_until = timezone.now() + timedelta(seconds=settings.CHAT_LEASE_SECONDS)
        answer.admission = admission
        answer.finished_at = None
        reopened = Message.objects.filter(pk=answer.pk, status=previous).update(
            status=answer.status,
            model=answer.model,
            tier=tier,
            picked=answer.picked,
            error="",
            owner=answer.owner,
            lease_until=answer.lease_until,
            admission=admission,
            finished_at=None,
        )
        if not reopened:
            raise conversations.BadRequest(ALREADY)
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())
    return Reopened(
        answer,
        conversation,
        history,
        html,
        answer.text,
        answer.chunk_count,
        Usage(answer.prompt_tokens, answer.completion_tokens, answer.usage_estimated),
        prompt,
        previous,
    )


def seq_base(reopened: Reopened) -> int:
    """The seq its continuation's first chunk gets: the earlier `done.seq` (1 for an answer
    that had text but no chunk count)."""
    if reopened.chunk_count or not reopened.text:
        return reopened.chunk_count
    return 1


async def earlier_chunks(reopened: Reopened) -> list[str]:
    """The chunks the answer had, seq 0 … chunk_count-1, and reopen its stream log.

    They come from the stream log while it holds them all (an hour after the answer ended);
    otherwise the text so far is chunk 0 and the rest are empty: joined they are the same text,
    and the continuation's seqs still go on from the earlier `done.seq`.
    """
    log = get_stream_log()
    count, text = reopened.chunk_count, reopened.text
    chunks: list[str] = []
    try:
        held = await log.chunks(reopened.answer.mid)
        if [c.seq for c in held] == list(range(count)) and "".join(c.text for c in held) == text:
            chunks = [c.text for c in held]
        await log.reopen(reopened.answer.mid)
    except StreamLogUnavailable:
        pass  # the continuation's appends are retried like any other; followers fall back
    if not chunks and (count or text):
        chunks = [text] + [""] * (seq_base(reopened) - 1)
    return chunks


def shell_for_watchers(
    next_seq: int, html: str, opened: tuple[int, int, str] | None = None
) -> dict[str, Any]:
    """What the other tabs showing the answer need to go on from what they show (the
    `chat.exchange` event carries it): the asking tab's shell, but its HTML named by length and
    digest, not carried: it is the start of the answer's stored HTML, which they load anyway."""
    shell: dict[str, Any] = {"next": next_seq, "chars": len(html), "digest": _digest(html)}
    if opened is not None:
        shell["opened"] = list(opened)
    return shell


def watcher_shell_html(answer: Message, shell: dict[str, Any] | None) -> str:
    """Another tab's shell of an answer going on: what it shows (the earlier answer), going on
    from the earlier `done.seq`, as the asking tab's (no query, no rendering).

    Its HTML is the start of the answer's stored HTML (the blocks of the earlier text are those
    of the finished answer: they depend on the text alone). Should that not hold (a shell from
    before this, an answer whose HTML is not its blocks), the shell comes empty and the tab
    replays the answer from its first chunk, as before."""
    if shell is not None:
        html = (answer.html or "")[: shell["chars"]]
        if _digest(html) == shell["digest"]:
            opened = shell.get("opened")
            return fragments.continuation_html(
                answer,
                html,
                next_seq=shell["next"],
                watch=True,
                opened=(opened[0], opened[1], opened[2]) if opened else None,
            )
    return fragments.continuation_html(answer, "", next_seq=0, watch=True)


def _digest(html: str) -> str:
    return hashlib.sha256(html.encode()).hexdigest()
