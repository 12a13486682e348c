"""The markup written once per message — its bubble (its `<article>`) and an answer's 👍/👎
controls — as HTML: the one place it is written. The page, the thread's windows and every frame
that brings a message (a new exchange, a finished answer, an answer going on) use these
functions; chat/menus.py writes the sidebar's entries and the header's menus the same way.

Why not templates: they ran through Django's template engine on every turn (the new exchange's
frame, the finished answer's) and once per message and sidebar entry of every page, about 0.3
to 0.5 ms each (issue 18; docs/decisions/performance.md, *Bubbles, feedback and sidebar entries
without the template engine*). Written out they cost a few microseconds. Every value is escaped
with `esc` unless it is HTML already (the answer's sanitised rendering, a CSRF input)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import Any

from django.urls import get_script_prefix, reverse
from django.utils.formats import date_format
from django.utils.timezone import localtime

from chat.branches import ThreadEntry
from chat.conversations import DELETED
from chat.models import Message
from chat.upstream.errors import (
    NO_SUCH_MODEL_MESSAGE,
    NOT_ALLOWED_MESSAGE,
    REFUSED_REQUEST_MESSAGE,
)

PREVIOUS, NEXT = "\u2039", "\u203a"  # the versions' arrows: single angle quotation marks

SETTINGS_ADVICE = (
    "Retrying will not help until the site's model settings are fixed: tell whoever runs this site."
)
# Failures that the same request meets again, whatever the moment: Retry is not offered for
# them. Everything else (the model server down, busy or slow, a dropped connection, a crash on
# our side) may well succeed a moment later.
_NO_RETRY = {
    NOT_ALLOWED_MESSAGE: SETTINGS_ADVICE,
    NO_SUCH_MODEL_MESSAGE: SETTINGS_ADVICE,
    REFUSED_REQUEST_MESSAGE: (
        "Retrying the same message will not help: shorten it, or start a new chat."
    ),
    DELETED: "",
}


def _words(error: str) -> str:
    # Saved errors are these sentences, with or without their full stop.
    return (error or "").strip().rstrip(".")


_NO_RETRY_BY_WORDS = {_words(error): advice for error, advice in _NO_RETRY.items()}


@dataclass(frozen=True)
class Failure:
    """What a failed answer's footer offers: Retry, or advice when a retry cannot succeed."""

    retry: bool
    advice: str = ""


def failure(error: str) -> Failure:
    """Whether Retry can succeed for this saved error, and what to do instead if not."""
    advice = _NO_RETRY_BY_WORDS.get(_words(error))
    return Failure(retry=True) if advice is None else Failure(retry=False, advice=advice)


@dataclass(frozen=True)
class Live:
    """An answer going on (Continue) with an open block: its first `placed` blocks cover its
    text up to `end` (code points) and `open` is the rest, as JSON (docs/protocol.md)."""

    placed: int
    end: int
    open: str


# reverse() costs 20-50 µs a call, and a sidebar of 50 entries made 350 of them: each URL
# written here is reversed once per name and script prefix with placeholders (UUIDs, which
# every converter used here accepts), then its placeholders are replaced in one pass. Only
# for plain ids (a UUID, a mid: letters, digits, "-", "_", "."), which reverse() would take
# and leave as they are; anything else goes through reverse() itself, which checks it.
_PLACEHOLDERS = tuple(f"00000000-0000-4000-8000-{i:012d}" for i in range(3))
_PLACEHOLDER = re.compile("|".join(_PLACEHOLDERS))
_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_reversed: dict[tuple[str, str, int], str] = {}


def url(name: str, *args: object, prefix: str | None = None) -> str:
    """`reverse(name, args=args)`, for the ids of rows this site wrote (UUIDs, mids). `prefix`:
    the script prefix, when the caller has it (reading it costs a context variable lookup)."""
    values = [str(arg) for arg in args]
    if len(values) > len(_PLACEHOLDERS) or not all(_PLAIN_ID.fullmatch(v) for v in values):
        return reverse(name, args=args)
    key = (name, get_script_prefix() if prefix is None else prefix, len(values))
    found = _reversed.get(key)
    if found is None:
        found = _reversed[key] = reverse(name, args=_PLACEHOLDERS[: len(values)])
    if len(values) == 1:
        return found.replace(_PLACEHOLDERS[0], values[0])
    return _PLACEHOLDER.sub(lambda m: values[_PLACEHOLDERS.index(m.group())], found)


def esc(value: object) -> str:
    """As Django's autoescape writes a value: str() of it, with & < > " ' escaped."""
    return escape(str(value))


def message_html(
    m: Message,
    *,
    entry: ThreadEntry | None = None,
    rendered: str = "",
    watch: bool = False,
    next_seq: int = 0,
    oob: bool = False,
    blocks: int | None = None,
    live: Live | None = None,
) -> str:
    """A message's `<article>`: a prompt with its Edit, or an answer with its body (`rendered`,
    sanitised HTML, for a finished one), its versions' arrows (`entry`), what failed and what
    can be done, its details line and its source. `watch` marks a shell sent to a tab that did
    not ask, `next_seq` the seq an answer going on streams from, `oob` an out-of-band swap,
    `blocks` how many `block` frames its body joins, `live` the open block of an answer going
    on. Reads `m.votes` (prefetched, chat/branches.py) for the 👍/👎 when it is there."""
    mid = esc(m.mid)
    user = m.role == "user"
    status = m.status
    out: list[str] = []
    if user:
        out.append(
            f'\n<article class="msg msg-user" id="msg-{mid}" data-mid="{mid}"'
            ' aria-label="You said">'
            f'\n  <div class="body">{esc(m.text)}</div>\n'
        )
    else:
        opening = f'\n<article class="msg msg-assistant" id="msg-{mid}" data-mid="{mid}"'
        opening += f' data-status="{esc(status)}"'
        if watch:
            opening += ' data-watch="1"'
        if next_seq:
            opening += f' data-next="{esc(next_seq)}"'
        if oob:
            opening += ' hx-swap-oob="true"'
        out.append(opening + ' aria-label="Answer">\n')
        title = "Picked in the composer" if m.picked else f"{esc(m.get_tier_display())} tier"
        out.append(
            f'  <div class="meta"><span class="model" title="{title}">{esc(m.model)}</span></div>\n'
        )
        body = '  <div class="body markdown"'
        if blocks is not None:
            body += f' data-blocks="{esc(blocks)}"'
        if live is not None:
            body += (
                f' data-placed="{esc(live.placed)}" data-end="{esc(live.end)}"'
                f' data-open="{esc(live.open)}"'
            )
        busy = "true" if status == "streaming" else "false"
        out.append(f'{body} aria-busy="{busy}">{rendered or ""}</div>\n')
    out.append('\n  <div class="msg-footer">\n    \n    ')
    if entry is not None and entry.versions > 1:
        out.append(_versions(m, entry))
    out.append("\n    ")
    if user:
        out.append('<button type="button" class="edit" data-action="edit">Edit</button>')
    else:
        out.append(_answer_footer(m))
    out.append("\n  </div>\n  \n  \n  ")
    if not user and status == "streaming":
        out.append('<p class="answer-details is-pending" aria-hidden="true">&nbsp;</p>')
    out.append("\n  ")
    if not user and status != "streaming":
        out.append(_details(m))
    out.append("\n  ")
    if not user and status != "streaming":
        out.append(f'<template class="source">{esc(m.text)}</template>')
    out.append("\n</article>\n")
    return "".join(out)


def _versions(m: Message, entry: ThreadEntry) -> str:
    """The "< 2 / 3 >" arrows: each posts the neighbour version's mid and htmx shows the
    branch that continues from it."""

    def arrow(kind: str, label: str, sign: str, mid: str) -> str:
        if mid:
            switch = esc(url("chat:switch_version", m.conversation_id, mid))
            target = (
                f' hx-post="{switch}" hx-target="#messages" hx-swap="innerHTML"'
                f' data-version-mid="{esc(mid)}"'
            )
        else:
            target = " disabled"
        return (
            f'<button type="button" class="version-{kind}" aria-label="{label}"{target}>'
            f"{sign}</button>"
        )

    version, versions = esc(entry.version), esc(entry.versions)
    return (
        f'<div class="versions" role="group" aria-label="Version {version} of {versions}">\n'
        f"      {arrow('prev', 'Previous version', PREVIOUS, entry.previous)}\n"
        f'      <span class="version-count" aria-hidden="true">{version} / {versions}</span>\n'
        f"      {arrow('next', 'Next version', NEXT, entry.next)}\n"
        "    </div>"
    )


def _answer_footer(m: Message) -> str:
    """What can be done with an answer: what stopped or failed it, Retry or advice, Continue,
    Regenerate, Copy, 👍/👎."""
    status = m.status
    out = ["\n    "]
    if status == "stopped":
        out.append(f'<span class="note">{esc(m.error or "Stopped.")}</span>')
    out.append("\n    ")
    if status == "failed":
        # The saved error is already in plain words (chat/upstream/errors.py); Retry only where
        # it can succeed, else what to do instead; the answer's id for whoever runs the site.
        found = failure(m.error)
        out.append("\n    \n    ")
        out.append(
            f'<span class="note error" role="status">{esc(m.error or "The answer failed.")}</span>'
        )
        out.append("\n    ")
        if found.retry:
            out.append('<button type="button" class="retry" data-action="retry">Retry</button>')
        elif found.advice:
            out.append(f'<span class="note advice">{esc(found.advice)}</span>')
        details = f"Answer id <code>{esc(m.mid)}</code>"
        if m.model:
            details += f", model {esc(m.model)}"
        if m.finished_at:
            details += ", " + esc(date_format(localtime(m.finished_at), "Y-m-d H:i e"))
        out.append(
            '\n    <details class="failure-details"><summary>Details</summary>'
            f"<p>{details}. If it keeps failing, give this to whoever runs this site.</p>"
            "</details>\n    "
        )
    out.append("\n    ")
    if status == "complete" and m.error:
        out.append(f'<span class="note">{esc(m.error)}</span>')
    # Continue shows on the thread's last answer only (chat.css); a failed answer has Retry,
    # which does the same.
    out.append("\n    \n    ")
    if m.continuable:
        out.append(
            '<button type="button" class="continue" data-action="continue">Continue</button>'
        )
    out.append("\n    ")
    if status in ("complete", "stopped"):
        out.append(
            '<button type="button" class="regenerate" data-action="regenerate">Regenerate</button>'
        )
    finished = status != "streaming" and bool(m.text)
    out.append("\n    ")
    if finished:
        out.append(
            '<button type="button" class="copy" data-action="copy" aria-label="Copy answer">'
            "Copy</button>"
        )
    out.append("\n    ")
    if finished:
        votes: Any = getattr(m, "votes", None)
        out.append(feedback_html(m, votes[0] if votes else None, on_page=True))
    out.append("\n    ")
    return "".join(out)


def _details(m: Message) -> str:
    """The details line of a finished answer: which model wrote it and the tokens it cost
    (chat/exports.py exports the same)."""
    if m.picked:
        how = " · picked"
    elif m.tier:
        how = f" · {esc(m.get_tier_display().lower())} tier"
    else:
        how = ""
    estimated = " (estimated)" if m.usage_estimated else ""
    return (
        f'<p class="answer-details"><span class="details-model">'
        f"{esc(m.model or 'unknown model')}</span>{how} · "
        f'<span class="details-tokens">{esc(m.prompt_tokens)} tokens in · '
        f"{esc(m.completion_tokens)} out{estimated}</span></p>"
    )


def feedback_html(m: Message, vote: Any, *, sent: bool = False, on_page: bool = False) -> str:
    """An answer's 👍/👎 (chat/feedback.py). `vote` is this person's Feedback, if any; a 👎
    opens a box for what was wrong, which closes once its comment is `sent` (pressing 👎 again
    opens it with the comment). htmx swaps this whole block with the server's answer.
    `on_page`: written with its answer (a page, a frame), not in answer to a vote: a 👎 whose
    comment was given shows its thanks, not the box again on every visit."""
    mid = esc(m.mid)
    post = esc(url("chat:feedback", m.mid))
    value = vote.vote if vote else ""
    form = (
        f'method="post" action="{post}" hx-post="{post}" hx-target="#feedback-{mid}"'
        ' hx-swap="outerHTML"'
    )
    out = [
        f'\n<div class="feedback" id="feedback-{mid}" data-vote="{esc(value or "")}">\n'
        f'  <form class="vote" {form}>\n'
        '    <button type="submit" name="value" value="up" class="vote-up"'
        ' aria-label="Good answer" title="Good answer"'
        f' aria-pressed="{"true" if value == "up" else "false"}">👍</button>\n'
        '    <button type="submit" name="value" value="down" class="vote-down"'
        ' aria-label="Bad answer" title="Bad answer"'
        f' aria-pressed="{"true" if value == "down" else "false"}">👎</button>\n'
        "  </form>\n  "
    ]
    if value == "down" and not sent and not (on_page and vote.comment):
        comment = vote.comment
        out.append(
            f'\n  <form class="feedback-comment" {form}>\n'
            '    <input type="hidden" name="value" value="down">\n'
            f'    <label for="feedback-comment-{mid}">What was wrong with this answer?'
            " (optional)</label>\n"
            f'    <textarea id="feedback-comment-{mid}" name="comment" rows="2" maxlength="2000"'
            f"{'' if comment else ' autofocus'}>{esc(comment)}</textarea>\n"
            '    <div class="feedback-actions"><button type="submit" class="primary">'
            "Send feedback</button></div>\n"
            "  </form>\n  "
        )
    elif sent:
        out.append('<span class="note" role="status">Thanks, your feedback was sent.</span>\n  ')
    elif vote:
        out.append('<span class="note" role="status">Thanks for your feedback.</span>')
    out.append("\n</div>\n")
    return "".join(out)
