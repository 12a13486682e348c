"""The XSS corpus through the live renderer: every block, mid-stream, is what the sanitiser allows.

Each payload is streamed as an answer of its own, whole and one character per chunk; then the
whole corpus as one long answer (payloads separated by blank lines, and by single line breaks
so that they run into each other's blocks), per token and per character. Every block that
comes out, before and at `finish`, must pass the same oracle as the whole-answer tests.
"""

from __future__ import annotations

import pytest

from chat.rendering import Block, LiveRenderer, render_markdown
from tests.markdown_answers import tokens
from tests.rendering_oracle import PAYLOADS, unsafe_parts


def blocks_of(pieces: list[str]) -> tuple[LiveRenderer, list[Block]]:
    renderer = LiveRenderer()
    blocks = [block for piece in pieces for block in renderer.feed(piece)]
    return renderer, blocks + renderer.finish()


def assert_inert(blocks: list[Block]) -> None:
    for block in blocks:
        assert unsafe_parts(block.html) == [], (block.index, block.html)


@pytest.mark.parametrize("payload", PAYLOADS, ids=[f"payload{n:03d}" for n in range(len(PAYLOADS))])
def test_a_payload_streamed_whole_or_per_character_renders_inert(payload: str) -> None:
    _, whole = blocks_of([payload])
    renderer, per_char = blocks_of(list(payload))
    assert_inert(whole)
    assert per_char == whole
    assert unsafe_parts(renderer.final_html()) == []


@pytest.mark.parametrize("separator", ["\n\n", "\n"], ids=["blank-line", "line-break"])
def test_the_whole_corpus_as_one_answer_streams_inert_per_token_and_per_character(
    separator: str,
) -> None:
    answer = separator.join(PAYLOADS)
    renderer, per_token = blocks_of(tokens(answer))
    _, per_char = blocks_of(list(answer))
    assert_inert(per_token)
    assert per_char == per_token
    assert unsafe_parts(renderer.final_html()) == []
    if renderer.whole_matches:
        assert renderer.final_html() == render_markdown(answer)


def test_blocks_mid_stream_are_inert_before_the_answer_is_done() -> None:
    # What a tab shows before `done` is exactly the blocks fed so far: check them at each
    # step, not only at the end.
    answer = "\n\n".join(PAYLOADS[:60])
    renderer = LiveRenderer()
    seen = 0
    for piece in tokens(answer):
        new = renderer.feed(piece)
        assert_inert(new)
        seen += len(new)
    assert seen > 10  # most blocks came out mid-stream
    assert_inert(renderer.finish())
