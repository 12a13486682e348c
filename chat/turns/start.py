"""Starting a turn from an admitted frame: store the exchange, trim its history, start the turn;
settle the admission when it never becomes a turn."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from chat import conversations, fragments, sessions
from chat.limits.budget import Fitted, answer_cap, answer_share, fit, prompt_tokens
from chat.limits.plans import UserLimits, limits_for
from chat.protocol import Continue, Prompt, Regenerate, TurnFrame
from chat.tiers.picker import pick
from chat.tiers.policy import TierDecision, aload_policy, lite_only
from chat.turns import titles
from chat.turns.continuation import (
    Reopened,
    do_continue,
    earlier_chunks,
    seq_base,
    shell_for_watchers,
)
from chat.turns.history import trim_history
from chat.turns.registry import registry
from chat.turns.turn import Settlement, Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    """A turn that runs, the exchange it answers, and the bubbles' HTML for the asking tab."""

    turn: Turn
    exchange: conversations.Exchange
    html: str
    # A continuation's shell as the other tabs showing it make theirs (continuation.py).
    shell: dict[str, Any] | None = None


async def start_turn(
    frame: TurnFrame,
    admission: Settlement,
    *,
    user_id: int,
    session_key: str | None,
    tier: TierDecision,
    received: float | None = None,
) -> Started:
    """Store the exchange a frame asks for and start its turn, which then owns the admission.

    Raises conversations.BadRequest / NotFound for a frame that cannot be acted on and
    conversations.SessionEnded for a socket whose session is over; in every such case the
    admission is settled here (nothing was delivered, so the reservation is refunded) before
    the error propagates.
    `received` is when the frame arrived (the loop's clock), for the turn's added TTFT.
    """
    try:
        # The plan, not the device, has the last word on the full model (issue 13.10): by
        # the limits the admission resolved, so no second trip to the ORM thread when the
        # cache ran out meanwhile (a burst's queue there is seconds long).
        tier = await tier_within_plan(tier, user_id, getattr(admission, "limits", None))
        picked = _picked(frame, tier)
        # One trip to the ORM thread: the session re-check, the exchange (and a fork's HTML).
        begun = await database_sync_to_async(_begin_exchange)(
            frame,
            user_id,
            session_key,
            model=tier.model,
            tier=tier.tier,
            admission=admission.record(),
            picked=picked,
            allowed=frozenset(model for model, _label in tier.models),
        )
    except BaseException:
        await admission.settle(None)
        raise
    if begun is None:
        await admission.settle(None)
        raise conversations.SessionEnded
    exchange, html, reopened = begun
    try:
        if html is None:
            # A plain exchange's frame needs no query and, written out (chat/bubbles.py), costs
            # tens of microseconds: less than a trip to a thread, so it is written here, before
            # the turn starts, and the asking tab gets it before any chunk.
            html = _asking_tab_html(exchange)
        earlier = None
        if reopened is not None:
            earlier = (await earlier_chunks(reopened), reopened.usage)
        budget = await fit_budget(exchange.history, admission, tier.max_tokens)
    except BaseException:
        # No turn will own the admission: give it back (the stored answer's lease runs out
        # and the reaper marks it failed).
        await admission.settle(None)
        raise
    turn = Turn(
        mid=exchange.answer.mid,
        conversation_id=str(exchange.conversation.id),
        user_id=user_id,
        model=exchange.answer.model,
        tier=tier.tier,
        messages=budget.messages if budget else _trim(exchange.history),
        max_tokens=budget.max_tokens if budget else answer_cap(tier.max_tokens),
        temperature=tier.temperature,
        admission=admission,
        received=received,
        budget=budget,
        earlier=earlier,
        only_version=exchange.prompt is not None,
    )
    shell = None
    if reopened is not None:
        try:
            html, shell = await _continuation_shell(turn, reopened)
        except BaseException:  # as above: no turn will own the admission
            await admission.settle(None)
            raise
    registry.start(turn)
    title_prompt = _title_prompt(frame, exchange, reopened)
    if title_prompt is not None:
        # Once this first answer completes, in the background: the conversation's title.
        titles.schedule(turn, conversation_id=str(exchange.conversation.id), prompt=title_prompt)
    return Started(turn, exchange, html, shell)


def _title_prompt(
    frame: TurnFrame, exchange: conversations.Exchange, reopened: Reopened | None
) -> str | None:
    """The prompt to title the conversation by if this turn's answer completes: a new
    conversation's first prompt; or, for Continue, the first prompt again when the answer
    going on is its answer and never completed (stopped or cut), so it was never titled."""
    if exchange.created and isinstance(frame, Prompt):
        return frame.text
    if reopened is not None and reopened.never_titled:
        return reopened.prompt.text
    return None


async def _continuation_shell(turn: Turn, reopened: Reopened) -> tuple[str, dict[str, Any]]:
    """The asking tab's shell of an answer going on: the final blocks of its earlier text, as
    the turn will count them, and the text of its open block, which the page previews and the
    continuation extends (the same paragraph goes on). Without live rendering (it failed):
    the earlier HTML, and the end swaps the whole answer. With it, what the other tabs need
    to make the same shell from what they show."""
    blocks = await turn.open_earlier()
    next_seq = seq_base(reopened)
    if blocks is None:
        html = fragments.continuation_html(
            reopened.answer, reopened.html, next_seq=next_seq, watch=False
        )
        return html, shell_for_watchers(next_seq, reopened.html)
    end = blocks[-1].end if blocks else 0
    placed = "".join(block.html for block in blocks)
    opened = (len(blocks), end, reopened.text[end:])
    html = fragments.continuation_html(
        reopened.answer, placed, next_seq=next_seq, watch=False, opened=opened
    )
    return html, shell_for_watchers(next_seq, placed, opened)


async def tier_within_plan(
    tier: TierDecision, user_id: int, limits: UserLimits | None = None
) -> TierDecision:
    """The tier a user's turn may have: the device's, unless their plan forbids the full model
    (Plan.full_model_allowed off), then lite whatever the device said. The limits are those
    the admission resolved (`limits`), else the user's (cached 2 s, dropped when an admin
    edits a plan).

    Checked for lite sockets too: a phone may pick the full tier's model where an admin lists
    it as a pickable model, and a plan switched off under its open socket must take it away."""
    if limits is None:
        limits = await limits_for(user_id)
    if limits.full_model:
        return tier
    return lite_only(tier, await aload_policy())


def _picked(frame: TurnFrame, tier: TierDecision) -> str | None:
    """The model a frame asks for, if this connection may pick it (BadRequest if not: a model
    that is not allowed is never sent upstream)."""
    try:
        return pick(getattr(frame, "model", None), tier)
    except LookupError:
        raise conversations.BadRequest(
            "That model is not available to you here. Pick one from the list."
        ) from None


def _trim(history: list[dict[str, str]]) -> list[dict[str, str]]:
    return trim_history(history, settings.LLM_CONTEXT_CHARS)


async def fit_budget(
    history: list[dict[str, str]], admission: Settlement, tier_max_tokens: int | None
) -> Fitted | None:
    """Fit the reservation to the prompt now that it is known, and the prompt and the
    answer's `max_tokens` to the reservation; None when no budget caps this turn.

    The middleware reserved for the new text and a whole answer before the history was
    loaded: here the reservation grows to the real prompt and a whole answer (at most what is
    left) and what the turn cannot use is given back, so what is reserved always covers what
    is sent: the prompt estimate plus `max_tokens`.
    """
    if not admission.limited:
        return None
    granted = await admission.resize(prompt_tokens(_trim(history)) + answer_share(tier_max_tokens))
    fitted = fit(
        history,
        granted,
        tier_max_tokens,
        trim=trim_history,
        context_chars=settings.LLM_CONTEXT_CHARS,
    )
    if fitted.tokens < granted:
        await admission.resize(fitted.tokens)
    return fitted


def _begin_exchange(
    frame: TurnFrame,
    user_id: int,
    session_key: str | None,
    *,
    model: str,
    tier: str,
    admission: dict[str, Any] | None = None,
    picked: str | None = None,
    allowed: frozenset[str] = frozenset(),
) -> tuple[conversations.Exchange, str | None, Reopened | None] | None:
    """Store a new exchange; None if the session has ended.

    The socket's user was resolved at connect, so the session is re-checked per prompt
    (PITFALLS). All of it runs in one call on the ORM thread: that thread is a queue every
    turn passes through, and each extra trip is a wait on the path to the first token.
    The HTML is rendered here only for a fork (its "2 / 3" arrows query); a plain exchange's
    is None, rendered by the caller (`_asking_tab_html`, no query), not on this thread.
    """
    if not sessions.session_is_valid(user_id, session_key):
        return None
    if isinstance(frame, Prompt):
        exchange = conversations.do_start_exchange(
            user_id,
            frame.conversation,
            frame.text,
            model=model,
            tier=tier,
            replaces=frame.replaces,
            admission=admission,
            picked=picked,
            allowed=allowed,
        )
    elif isinstance(frame, Regenerate):
        exchange = conversations.do_regenerate(
            user_id,
            frame.mid,
            model=model,
            tier=tier,
            admission=admission,
            picked=picked,
            allowed=allowed,
        )
    elif isinstance(frame, Continue):
        reopened = do_continue(
            user_id, frame.mid, model=model, tier=tier, allowed=allowed, admission=admission
        )
        exchange = conversations.Exchange(
            reopened.conversation, False, None, reopened.answer, reopened.history, continued=True
        )
        # Its shell waits for the earlier text's blocks (`_continuation_shell`), rendered off
        # this thread.
        return exchange, "", reopened
    else:  # pragma: no cover - TurnFrame is closed
        raise conversations.BadRequest("That frame does not start a turn.")
    if not exchange.forked:
        return exchange, None, None
    # Only the new messages, even for a fork: the page drops what followed the fork itself.
    return exchange, _asking_tab_html(exchange), None


def _asking_tab_html(exchange: conversations.Exchange) -> str:
    """The asking tab's bubbles of a new exchange. No query for a plain exchange, given the
    objects `_begin_exchange` loaded (tests/test_queries.py), so it runs on the event loop; a
    fork's "2 / 3" arrows query, so a fork's runs on the ORM thread."""
    return fragments.exchange_html(exchange, target="#messages", watch=False)
