"""A turn's token budget: what it asks the limiter to reserve, and the prompt and `max_tokens`
it may send with what it got (docs/decisions/rate-limiting.md, "A reservation is a cap")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from chat.tokens import chars_to_tokens

# "Almost nothing left": a turn is refused when what is left would not pay for its prompt and
# an answer of this many tokens (a sentence or two). Fewer would spend the prompt's tokens on
# an answer cut off before it says anything; more would refuse answers a user can still use.
MIN_ANSWER_TOKENS = 32
# What a chat template adds around each message (role markers, separators): about 4 tokens
# with OpenAI's and Llama's templates. Counting it keeps the estimate on the safe side of
# what the model server will report.
MESSAGE_OVERHEAD_TOKENS = 4


def answer_cap(tier_max_tokens: int | None) -> int | None:
    """The longest answer configured: the model tier's max_tokens, else LLM_MAX_TOKENS.

    None: nothing caps answers, and without a budget the model server decides.
    """
    return tier_max_tokens or settings.LLM_MAX_TOKENS or None


def answer_share(tier_max_tokens: int | None) -> int:
    """The longest answer when a budget applies: the configured cap, else CHAT_RESERVE_TOKENS.

    A budget needs a finite cap: `max_tokens` = all that is left would hold the whole day's
    quota for one answer (no second tab could send) and exceeds what real models accept.
    """
    return max(1, answer_cap(tier_max_tokens) or settings.CHAT_RESERVE_TOKENS)


def least_answer(tier_max_tokens: int | None) -> int:
    return min(MIN_ANSWER_TOKENS, answer_share(tier_max_tokens))


def prompt_tokens(messages: list[dict[str, str]]) -> int:
    """The estimate of a prompt's tokens: its text by the rule of thumb, plus each message's
    template overhead."""
    return sum(
        chars_to_tokens(len(m.get("content") or "")) + MESSAGE_OVERHEAD_TOKENS for m in messages
    )


@dataclass(frozen=True)
class TurnAsk:
    """What the limiter is asked for when a turn frame arrives, before its history is known:
    `want` (the new text and a whole answer) and `at_least` (the new text and the shortest
    useful answer). The reservation is fitted to the real prompt when the turn starts."""

    want: int
    at_least: int


def turn_ask(new_text: str, tier_max_tokens: int | None) -> TurnAsk:
    text = prompt_tokens([{"role": "user", "content": new_text}]) if new_text else 0
    return TurnAsk(
        want=text + answer_share(tier_max_tokens),
        at_least=text + least_answer(tier_max_tokens),
    )


@dataclass(frozen=True)
class Fitted:
    """The prompt a turn sends and the `max_tokens` it asks for, within its reservation."""

    messages: list[dict[str, str]]
    prompt_tokens: int
    max_tokens: int
    cut_by_budget: bool  # the budget, not the configured cap, limits the answer

    @property
    def tokens(self) -> int:
        """What the turn may use at most: its reservation once fitted."""
        return self.prompt_tokens + self.max_tokens


Trim = Callable[[list[dict[str, str]], int], list[dict[str, str]]]


def fit(
    history: list[dict[str, str]],
    granted: int,
    tier_max_tokens: int | None,
    *,
    trim: Trim,
    context_chars: int,
) -> Fitted:
    """Fit a turn into the `granted` tokens: the prompt, then the longest answer left.

    `trim(history, chars)` keeps the newest history within `chars` (turns.history). When the
    prompt and a whole answer do not fit, the prompt keeps the newest history that fits in at
    most half the grant (more if the answer needs less), and never less than the message just
    asked if that fits with a short answer: with little left the model sees less of the
    conversation, rather than the user getting no answer or a cut question.
    """
    share = answer_share(tier_max_tokens)
    messages = trim(history, context_chars)
    prompt = prompt_tokens(messages)
    if prompt + share > granted:
        newest = prompt_tokens(messages[-1:])
        least = least_answer(tier_max_tokens)
        room = max(granted - share, granted // 2, min(newest, granted - least))
        if prompt > room:
            # The largest character budget whose prompt fits: trimming is monotonic in it.
            low, high = 0, context_chars
            while low < high:
                middle = (low + high + 1) // 2
                if prompt_tokens(trim(history, middle)) <= room:
                    low = middle
                else:
                    high = middle - 1
            messages = trim(history, low)
            prompt = prompt_tokens(messages)
    max_tokens = max(0, min(share, granted - prompt))
    return Fitted(messages, prompt, max_tokens, max_tokens < share)


QUOTA_REACHED = (
    "Stopped here: daily quota reached. The answer used the tokens left today; "
    "they come back at 00:00 UTC."
)
# An upstream that ignores max_tokens is stopped where the budget ends: at one token per delta
# (what OpenAI-style servers send), or at this many characters per token for a server that
# packs a long text into few deltas (generous: real tokens average about 4 characters).
BUDGET_CHARS_PER_TOKEN = 16


class QuotaReached(Exception):
    """The answer reached the tokens its turn may use today."""


class AnswerMeter:
    """Counts an answer against its budget as it streams."""

    def __init__(self, fitted: Fitted) -> None:
        self.allowed = fitted.max_tokens
        self.deltas = 0
        self.chars = 0

    def spend(self, text: str) -> None:
        """Count a delta; raise QuotaReached (the delta is then dropped) if it crosses."""
        if not text:
            return
        self.deltas += 1
        self.chars += len(text)
        if self.deltas > self.allowed or self.chars > self.allowed * BUDGET_CHARS_PER_TOKEN:
            raise QuotaReached


def usable(left: int | None) -> int | None:
    """What the usage meter shows: the tokens left, or 0 when too few are left for a turn."""
    if left is None:
        return None
    smallest = turn_ask("?", None).at_least
    return left if left >= smallest else 0
