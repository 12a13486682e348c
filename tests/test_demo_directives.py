"""The demo model's directives for instructions, Continue and titles (docs/protocol.md):
`/echo-system`, `/length`, a request ending with the assistant's partial answer, a title
request. The existing directives are unchanged (tests/test_demo_upstream.py)."""

from __future__ import annotations

import re
from typing import Any

from chat import demo_upstream
from chat.demo_upstream import DemoModel, default_reply, long_tokens
from chat.demo_upstream.answers import _DIRECTIVE_RE, continue_plan, plan_answer
from chat.demo_upstream.titles import title_for
from tests.demo_server import call_demo_app
from tests.servers import ROOT
from tests.test_demo_upstream import COMPLETIONS, chunks_of, text_of


def fast() -> DemoModel:
    return DemoModel(ttfb_ms=0, tokens_per_second=0)


async def answer(messages: list[dict[str, str]], **extra: Any) -> tuple[str, str]:
    """(text, finish_reason) of a streamed answer to `messages`."""
    body = {"model": "demo-full", "stream": True, "messages": messages, **extra}
    chunks = chunks_of(await call_demo_app(fast(), "POST", COMPLETIONS, body))
    finish = next(
        c["choices"][0]["finish_reason"]
        for c in chunks
        if isinstance(c, dict) and c["choices"] and c["choices"][0]["finish_reason"]
    )
    return text_of(chunks), finish


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def test_echo_system_answers_the_system_message_exactly() -> None:
    system = {"role": "system", "content": "Answer in French.\n\nBe brief."}
    assert await answer([system, user("/echo-system")]) == (
        "Answer in French.\n\nBe brief.",
        "stop",
    )
    assert await answer([user("/echo-system")]) == ("There is no system message.", "stop")


async def test_length_stops_with_finish_reason_length_and_continuations_go_on() -> None:
    whole = "".join(long_tokens(50))
    first, finish = await answer([user("/length 20 /long 50")])
    assert finish == "length" and first == "".join(long_tokens(20))
    partial = {"role": "assistant", "content": first}
    second, finish = await answer([user("/length 20 /long 50"), partial])
    assert finish == "length" and whole.startswith(first + second)
    third, finish = await answer(
        [user("/length 20 /long 50"), {"role": "assistant", "content": first + second}]
    )
    assert finish == "stop" and first + second + third == whole


async def test_a_continuation_of_a_stopped_answer_gives_the_rest() -> None:
    whole = "".join(long_tokens(30))
    partial = "".join(long_tokens(7))
    rest, finish = await answer([user("/long 30"), {"role": "assistant", "content": partial}])
    assert finish == "stop" and partial + rest == whole


async def test_a_continuation_of_a_cut_answer_is_not_cut_again() -> None:
    partial = "".join(long_tokens(5))
    rest, finish = await answer([user("/cut 12"), {"role": "assistant", "content": partial}])
    assert finish == "stop" and partial + rest == "".join(long_tokens(12))


# What a person would call these conversations: the prompt's subject in its own words, not
# "Demo chat" (what every directive and greeting-only prompt got, from a review) and not
# Every Word Capitalised. The first screen's starters come first.
TITLES = {
    "Explain how a rainbow forms, in three short paragraphs.": "Explain how a rainbow forms",
    "Write a Python function that checks whether a word is a palindrome, with a few tests.": (
        "Write a Python function"
    ),
    "Give me five ideas for a rainy weekend at home.": "Five ideas for a rainy weekend",
    "How do I greet someone in Python?": "Greet someone in Python",
    "Hi, can you please explain how DNS works?": "Explain how DNS works",
    "What is a monad?": "What is a monad",
    "fix my C++ code that crashes": "Fix my C++ code",
    "Tell me about the history of the Roman empire and its fall": "The history of the Roman empire",
    "summarise this:\nsome long pasted text": "Summarise",
    "/echo hello world": "Hello world",
    "/stall 2 what time is it?": "What time is it",
    "/long 300": "Long answer (300 tokens)",
    "/markdown 900": "Markdown sample (900 tokens)",
    "/cut 12": "Answer cut after 12 tokens",
    "/fail 503": "Error 503 from the model",
    "/length 20 /long 50": "Long answer (50 tokens)",
    "/echo-system": "System prompt",
    "/long": "Long answer",
    "👋": "👋",
}


async def test_a_title_request_gets_the_prompts_subject_in_a_few_words() -> None:
    system = {"role": "system", "content": "Write a short title (at most six words)."}
    for prompt, expected in TITLES.items():
        title, finish = await answer([system, user(prompt)])
        assert (title, finish) == (expected, "stop"), prompt
        # Short enough for the list and the tab: at most six words and 60 characters.
        assert len(title.split()) <= 6 and len(title) <= 60, title


def test_a_title_is_drawn_from_the_prompt_and_never_the_same_for_every_chat() -> None:
    for prompt in TITLES:
        title = title_for(prompt)
        assert title and title != "Demo chat" and title[0] == title[0].upper(), prompt
        if not prompt.startswith("/"):
            # Every word of the title is a word of the prompt (as typed, bar its first letter).
            words = prompt.lower().replace("\n", " ").split()
            assert all(any(w in word for word in words) for w in title.lower().split()), title
    assert title_for("") == "New chat"


def test_a_continuation_answers_the_planned_tokens_after_the_partial_text() -> None:
    """The rest of `/markdown` keeps the plan's own tokens: before, the demo split it again
    into words and counted the rest of a stopped `/markdown 2000` as ~1,130 tokens instead of
    ~2,000 (new-user review: "1319 out" for a whole answer)."""
    whole = plan_answer("/markdown 2000").tokens
    rest = continue_plan(plan_answer("/markdown 2000"), "".join(whole[:40])).tokens
    assert rest == whole[40:]


def test_every_directive_the_demo_reads_is_listed_where_directives_are_listed() -> None:
    """The demo's own welcome answer, its module's docstring, docs/protocol.md and the README
    name every directive it reads (its welcome once left out `/markdown`)."""
    read = set(_DIRECTIVE_RE.pattern.split("(", 1)[1].split(")", 1)[0].split("|"))
    assert "markdown" in read
    places = {
        "the welcome answer": default_reply("hi"),
        "chat/demo_upstream/__init__.py": demo_upstream.__doc__ or "",
        "docs/protocol.md": (ROOT / "docs" / "protocol.md").read_text(),
        "README.md": (ROOT / "README.md").read_text(),
    }
    for place, text in places.items():
        listed = set(re.findall(r"`?/([a-z-]+)(?=[ `])", text))
        assert read <= listed, f"{place} leaves out {sorted(read - listed)}"
