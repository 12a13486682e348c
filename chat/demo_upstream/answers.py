"""The demo model's answers: its directives, its deterministic texts, and its request errors."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from chat.demo_upstream.markdown import markdown_answer
from chat.demo_upstream.markdown import tokens as markdown_tokens

MODELS = ("demo-full", "demo-lite")
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_LONG_TOKENS = 200_000
MAX_STALL_SECONDS = 3600.0
# With tokens_per_second=0 tokens go out in batches of this many SSE events per body send:
# one send per token would make "as fast as possible" mostly per-send overhead.
FAST_BATCH_TOKENS = 64

# A token is a run of up to 12 non-space characters plus the whitespace after it (or a run of
# leading whitespace), so the tokens of any text join back to exactly that text.
_TOKEN_RE = re.compile(r"\S{1,12}\s*|\s+")
_DIRECTIVE_RE = re.compile(r"\s*/(echo-system|echo|long|markdown|fail|cut|stall|length)(?=\s|$)")
NO_SYSTEM = "There is no system message."
# What must be escaped to quote a question inline without it turning into markup.
_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|~")


class DemoRequestError(Exception):
    """A request the demo refuses, carried to an OpenAI-style error response."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


class ClientGone(Exception):
    """The client disconnected: the generation stops where it is."""


class ConnectionCut(Exception):
    """Raised after a `/cut` response when the server gives us no way to drop the socket.

    ASGI servers such as uvicorn and hypercorn answer an exception raised after the body
    started by closing the connection, which is exactly the failure /cut simulates.
    """


@dataclass
class AnswerPlan:
    """What a completion request asked for, once the directives are read."""

    tokens: list[str]
    stall_seconds: float = 0.0
    cut: bool = False
    fail_status: int | None = None
    # /length <n>: at most n tokens per request, then finish_reason "length".
    length_limit: int | None = None


@dataclass
class CompletionRequest:
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    prompt_tokens: int
    plan: AnswerPlan = field(default_factory=lambda: AnswerPlan(tokens=[]))


def tokenize(text: str) -> list[str]:
    """Split text into word-ish tokens that join back to exactly `text`."""
    return _TOKEN_RE.findall(text)


_LONG_WORDS = (
    "the stream carries each token quickly across a socket while browser renders "
    "markdown and server keeps every chunk in order so nothing is lost when tab "
    "reconnects later model answer quietly steady river signal window buffer frame "
    "light garden morning engine patient careful bright simple honest small large "
    "clear"
)
_LONG_VOCABULARY = tuple(_LONG_WORDS.split())
_long_tokens_cache: list[str] = []
_long_state = [20251129]  # the LCG state, kept so the cached text only ever grows


def _next_random(bound: int) -> int:
    # A tiny LCG: the same sequence on every run and Python version (`random` does not
    # promise that across versions), and fast enough for a few hundred thousand tokens.
    _long_state[0] = (_long_state[0] * 1103515245 + 12345) % 2**31
    return (_long_state[0] >> 8) % bound


def long_tokens(n: int) -> list[str]:
    """The first n tokens of one fixed text of sentences and paragraphs (a word + space)."""
    while len(_long_tokens_cache) < n:
        sentences = 3 + _next_random(3)
        for s in range(sentences):
            words: list[str] = []
            for _ in range(6 + _next_random(9)):
                word = _LONG_VOCABULARY[_next_random(len(_LONG_VOCABULARY))]
                if words and word == words[-1]:  # "morning morning" reads like a bug
                    word = _LONG_VOCABULARY[
                        (_LONG_VOCABULARY.index(word) + 1) % len(_LONG_VOCABULARY)
                    ]
                words.append(word)
            words[0] = words[0].capitalize()
            ending = ".\n\n" if s == sentences - 1 else ". "
            _long_tokens_cache.extend(w + " " for w in words[:-1])
            _long_tokens_cache.append(words[-1] + ending)
    return _long_tokens_cache[:n]


def _escape_markdown(text: str) -> str:
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in text)


def default_reply(question: str) -> str:
    """The friendly answer to a message without a directive: shows off markdown rendering."""
    asked = " ".join(question.split())
    if len(asked) > 120:
        asked = asked[:117] + "..."
    lines = ["## Hello from the demo model", ""]
    if asked:
        lines += [f"You asked: *{_escape_markdown(asked)}*", ""]
    lines += [
        "I am the **built-in demo model**. I do not really understand questions, but I answer "
        "the same way every time, so the whole chat can be tried and tested without a real "
        "model.",
        "",
        "- Answers **stream** token by token.",
        "- Markdown is rendered *safely* on the server.",
        "- Directives: `/echo <text>`, `/long <n>`, `/markdown <n>`, `/fail <status>`, "
        "`/cut <n>`, `/stall <seconds>`, `/length <n>`, `/echo-system`.",
        "",
        "```python",
        "def greet(name: str) -> str:",
        '    return f"Hello, {name}!"',
        "",
        'print(greet("chatsite"))',
        "```",
        "",
        "Have a nice day!",
    ]
    return "\n".join(lines)


def _int_argument(directive: str, raw: str | None, low: int, high: int) -> int:
    try:
        value = int(raw or "")
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise DemoRequestError(
            400, f"/{directive} needs a whole number from {low} to {high}", "invalid_directive"
        )
    return value


def plan_answer(text: str, system: str = "") -> AnswerPlan:
    """Read the directive (if any) at the start of the last user message; `system` is the
    request's system messages (what `/echo-system` answers)."""
    match = _DIRECTIVE_RE.match(text)
    if match is None:
        return AnswerPlan(tokens=tokenize(default_reply(text)))
    directive, rest = match.group(1), text[match.end() :]
    if directive == "echo":
        # Eat exactly one separator so "/echo  x" answers " x" and "/echo\nx" answers "x".
        if rest.startswith("\r\n"):
            rest = rest[2:]
        elif rest[:1] in (" ", "\t", "\n", "\r"):
            rest = rest[1:]
        return AnswerPlan(tokens=tokenize(rest))
    if directive == "echo-system":
        return AnswerPlan(tokens=tokenize(system or NO_SYSTEM))
    parts = rest.split(maxsplit=1)
    argument = parts[0] if parts else None
    remainder = parts[1] if len(parts) > 1 else ""
    if directive == "length":
        # /length <n> [rest]: answer [rest] as if it were the whole message, n tokens at most.
        limit = _int_argument("length", argument, 1, MAX_LONG_TOKENS)
        plan = plan_answer(remainder, system)
        plan.length_limit = limit if plan.length_limit is None else min(limit, plan.length_limit)
        return plan
    if directive == "long":
        return AnswerPlan(tokens=long_tokens(_int_argument("long", argument, 0, MAX_LONG_TOKENS)))
    if directive == "markdown":
        n = _int_argument("markdown", argument, 1, MAX_LONG_TOKENS)
        return AnswerPlan(tokens=markdown_tokens(markdown_answer(n)))
    if directive == "cut":
        n = _int_argument("cut", argument, 0, MAX_LONG_TOKENS)
        return AnswerPlan(tokens=long_tokens(n), cut=True)
    if directive == "fail":
        return AnswerPlan(tokens=[], fail_status=_int_argument("fail", argument, 400, 599))
    # /stall <seconds> [rest]: the rest is answered as if it were the whole message.
    try:
        seconds = float(argument or "")
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= MAX_STALL_SECONDS:  # also refuses nan
        raise DemoRequestError(
            400,
            f"/stall needs a number of seconds from 0 to {MAX_STALL_SECONDS:g}",
            "invalid_directive",
        )
    plan = plan_answer(remainder, system)
    plan.stall_seconds += seconds
    return plan


def continue_plan(plan: AnswerPlan, partial: str) -> AnswerPlan:
    """The plan for a request that ends with the assistant's partial answer (a continuation):
    the rest of the planned answer after `partial` when it starts with it, else the whole
    answer. A continuation is never cut again."""
    planned = "".join(plan.tokens)
    if partial and planned.startswith(partial):
        # The planned tokens after it when it ends between two (as a stop leaves it): then the
        # two requests' usage adds up to the whole answer's, whatever its tokenizer was.
        ends, done = [], 0
        for token in plan.tokens:
            ends.append(done := done + len(token))
        at = ends.index(len(partial)) + 1 if len(partial) in ends else None
        plan.tokens = plan.tokens[at:] if at is not None else tokenize(planned[len(partial) :])
    plan.cut = False
    return plan


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or OpenAI's list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise DemoRequestError(
                    400, "Unsupported message content part", "invalid_value", "messages"
                )
        return "".join(texts)
    raise DemoRequestError(
        400, "Message content must be a string or a list of parts", "invalid_type", "messages"
    )


def env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r} must be 0 or more")
    return value


def error_body(
    message: str, kind: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


FAIL_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "overloaded"),
    504: ("server_error", "timeout"),
}
