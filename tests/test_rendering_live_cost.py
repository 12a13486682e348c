"""LiveRenderer's work is linear in the answer: counted in characters handed to the parser.

Re-parsing the open tail at every chunk (or every line) would hand the parser a quadratic
number of characters: a 3,000-item list re-parsed per line is ~1,500 times its own length.
Each answer here is fed token by token, as a turn streams it; the renderer may parse a
character a few times (the open block when a line might have ended it, bounded by its
backoff), never once per line. No timing here: bench/live_render.py measures CPU.
"""

from __future__ import annotations

import pytest

from chat.rendering import LiveRenderer, render_markdown
from tests.markdown_answers import markdown_answer, tokens

EVERYDAY = {
    "a 20,000-token answer with code every 300 tokens": markdown_answer(20_000),
    "a 3,000-item list": "".join(f"- item number {i} with words\n" for i in range(3000))
    + "\nEnd.\n",
    "a loose numbered list with a paragraph per step": "".join(
        f"{i + 1}. **Step {i}**\n\n   What step {i} does.\n\n" for i in range(1500)
    )
    + "End.\n",
    "a nested list": "".join(f"- item {i}\n  - sub {i}\n    more {i}\n" for i in range(1500))
    + "\nEnd.\n",
    "a paragraph of 5,000 lines": "".join(f"line {i} of one paragraph\n" for i in range(5000))
    + "\nEnd.\n",
    "a 200,000-character line": "word " * 40_000 + "\n\nEnd.\n",
    "a 10,000-line code block": "```python\n"
    + "".join(f"x = {i}  # ```` not a fence\n" for i in range(10_000))
    + "```\n\nEnd.\n",
    "a 3,000-row table": "| a | b |\n|---|---|\n"
    + "".join(f"| {i} | v{i} |\n" for i in range(3000))
    + "\nEnd.\n",
    "a 3,000-line quote": "".join(f"> quoted line {i}\n" for i in range(3000)) + "\nEnd.\n",
    "3,000 lines of indented code": "".join(f"    code line {i}\n" for i in range(3000))
    + "\nEnd.\n",
    "a 3,000-line formula": "$$\n"
    + "".join(f"x_{{{i}}} +\n" for i in range(3000))
    + "$$\n\nEnd.\n",
}
# Text made to defeat the guess of which line could end the open block: the backoff holds it.
HOSTILE = {
    "lines that look like list items inside a paragraph": "x\n" + "2. y\n" * 5000 + "\nEnd.\n",
    "lazy lines continuing a list item": "- a\n" + "b\n" * 5000 + "\nEnd.\n",
    "3,000 link definitions": "".join(f"[r{i}]: https://example.com/{i}\n" for i in range(3000))
    + "\nEnd.\n",
    "lines that look like setext underlines": "para\n" + "= x\n" * 5000 + "\nEnd.\n",
    "3,000 empty headings": "para\n" + "# \n" * 3000 + "End.\n",
    "a list of lines each less indented than the last item": "- " + "\n - x" * 4000 + "\n",
}


def fed_per_token(text: str) -> tuple[LiveRenderer, int]:
    renderer = LiveRenderer()
    blocks = sum(len(renderer.feed(piece)) for piece in tokens(text))
    blocks += len(renderer.finish())
    return renderer, blocks


@pytest.mark.parametrize("text", EVERYDAY.values(), ids=EVERYDAY.keys())
def test_everyday_answers_are_parsed_about_once(text: str) -> None:
    renderer, blocks = fed_per_token(text)
    assert renderer.stats.parsed_chars <= 2 * len(text), renderer.stats
    assert renderer.stats.rendered_blocks == blocks  # each block rendered exactly once
    assert renderer.final_html() == render_markdown(text)


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_answers_cost_a_small_multiple_of_their_length(text: str) -> None:
    renderer, blocks = fed_per_token(text)
    assert renderer.stats.parsed_chars <= 5 * len(text), renderer.stats
    assert renderer.stats.rendered_blocks == blocks
    assert renderer.final_html() == render_markdown(text)


def test_a_chunk_without_a_line_break_is_never_parsed() -> None:
    renderer = LiveRenderer()
    for _ in range(10_000):
        renderer.feed("word ")
    assert renderer.stats.parses == 0
    renderer.feed("\n")
    assert renderer.stats.parses == 1  # the line is complete: one look at it


def test_an_open_code_block_is_not_parsed_again_per_line() -> None:
    renderer = LiveRenderer()
    renderer.feed("```python\n")
    parses = renderer.stats.parses
    for i in range(2000):
        renderer.feed(f"x = {i}\n")
    assert renderer.stats.parses == parses  # each new line was only checked for ``` itself
    [code] = renderer.feed("```\n")
    assert renderer.stats.parses == parses + 1
    assert "x = 1999" in code.html or ">1999<" in code.html
