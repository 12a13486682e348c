"""The demo model's directives for instructions, Continue and titles (docs/protocol.md):
`/echo-system`, `/length`, a request ending with the assistant's partial answer, a title
request. The existing directives are unchanged (tests/test_demo_upstream.py)."""

from __future__ import annotations

from typing import Any

from chat.demo_upstream import DemoModel, long_tokens
from tests.demo_server import call_demo_app
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


async def test_a_title_request_gets_a_few_capitalised_words() -> None:
    system = {"role": "system", "content": "Write a short title (at most six words)."}
    title, _ = await answer([system, user("Explain how a rainbow forms, in three paragraphs.")])
    assert title == "Explain How A Rainbow Forms"
    title, _ = await answer([system, user("/long 300")])
    assert title == "Demo chat"
