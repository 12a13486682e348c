"""Tests for chat.rendering.LiveRenderer: an answer rendered block by block while it streams.

The blocks must not depend on how the answer was cut into chunks, must add up to the
whole-document render (or say they do not), must each be final when returned, and must cost
linear work in the answer's length: counted here, timed in bench/live_render.py.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.rendering import Block, LiveRenderer, render_markdown
from tests.markdown_answers import markdown_answer, tokens


def stream(pieces: list[str]) -> tuple[LiveRenderer, list[Block], list[int]]:
    """Feed the pieces in order; also note after which piece each block came out."""
    renderer = LiveRenderer()
    blocks: list[Block] = []
    came_after: list[int] = []
    for n, piece in enumerate(pieces):
        for block in renderer.feed(piece):
            blocks.append(block)
            came_after.append(n)
    blocks += renderer.finish()
    return renderer, blocks, came_after


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def assert_blocks_tile_the_answer(text: str, blocks: list[Block]) -> None:
    assert [b.index for b in blocks] == list(range(len(blocks)))
    start = 0
    for block in blocks:
        assert block.start == start
        assert block.end > block.start
        start = block.end
    assert start <= len(text)
    # What follows the last block is blank lines or link definitions: it shows nothing.
    assert render_markdown(text[start:]) == ""


# --- what becomes final, and when --------------------------------------------------------------

ANSWER = (
    "# Plan\n\nFirst **bold** words and `code`.\nSecond line.\n\n- one\n- two\n- three\n\n"
    "```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n> quoted\n\nThe end"
)


def test_the_blocks_of_an_answer_fed_whole_add_up_to_its_render() -> None:
    renderer, blocks, _ = stream([ANSWER])
    assert [ANSWER[b.start : b.end].strip() for b in blocks] == [
        "# Plan",
        "First **bold** words and `code`.\nSecond line.",
        "- one\n- two\n- three",
        "```python\nprint('hi')\n```",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "> quoted",
        "The end",
    ]
    assert renderer.whole_matches
    assert "".join(b.html for b in blocks) == render_markdown(ANSWER) == renderer.final_html()
    assert_blocks_tile_the_answer(ANSWER, blocks)


def test_a_heading_is_final_as_soon_as_its_line_is_complete() -> None:
    renderer = LiveRenderer()
    assert renderer.feed("# Pla") == []
    assert renderer.feed("n") == []  # the line is still being written
    [heading] = renderer.feed("\n")
    assert heading.html == "<h1>Plan</h1>\n"
    assert (heading.start, heading.end) == (0, 7)


def test_a_paragraph_is_final_at_the_blank_line_after_it() -> None:
    renderer = LiveRenderer()
    assert renderer.feed("Some *words*\nand more\n") == []
    [paragraph] = renderer.feed("\n")
    assert paragraph.html == "<p>Some <em>words</em>\nand more</p>\n"


def test_a_code_block_is_final_at_its_closing_fence_and_not_before() -> None:
    renderer = LiveRenderer()
    assert renderer.feed("```js\nlet a = 1;\n\n\nlet b = 2;\n") == []
    assert renderer.feed("``") == []
    [code] = renderer.feed("`\n")
    assert 'data-lang="js"' in code.html
    assert ">b<" in code.html  # the last line is in it (highlighted)


def test_a_list_is_final_only_when_a_later_block_begins() -> None:
    renderer = LiveRenderer()
    assert renderer.feed("- one\n- two\n\n") == []  # a loose list may go on
    assert renderer.feed("  still item two\n\n- three\n\n") == []
    assert renderer.feed("After") == []  # a partial line begins nothing yet
    [the_list] = renderer.feed(" the list.\n")
    assert the_list.html.count("<li>") == 3
    assert "still item two" in the_list.html


def test_a_partial_last_line_is_rendered_by_finish() -> None:
    renderer = LiveRenderer()
    assert renderer.feed("just text, no newline") == []
    [paragraph] = renderer.finish()
    assert paragraph.html == "<p>just text, no newline</p>\n"
    assert renderer.final_html() == paragraph.html


def test_an_unclosed_fence_at_the_end_is_a_code_block_holding_the_rest() -> None:
    renderer, blocks, _ = stream(tokens("Intro\n\n```python\ndef f():\n    pass"))
    assert len(blocks) == 2
    assert blocks[1].html.startswith('<div class="codeblock" data-lang="python">')
    assert renderer.final_html() == render_markdown("Intro\n\n```python\ndef f():\n    pass")


def test_an_empty_answer_has_no_blocks() -> None:
    renderer, blocks, _ = stream(["", "\n\n", ""])
    assert blocks == []
    assert renderer.final_html() == render_markdown("\n\n") == ""


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_crlf_and_cr_line_breaks_make_the_same_blocks_however_they_are_cut(newline: str) -> None:
    text = ANSWER.replace("\n", newline)
    _, whole, _ = stream([text])
    _, per_char, _ = stream(list(text))  # every "\r\n" split across two chunks
    assert per_char == whole
    assert "".join(b.html for b in whole) == render_markdown(text)


def test_math_streams_as_blocks_like_everything_else() -> None:
    text = "Intro with $a+b$.\n\n$$\n\\frac{1}{2}\n$$\n\nAnd \\(c\\) too.\n"
    renderer, blocks, came_after = stream(list(text))
    assert [b.html.count("<math") for b in blocks] == [1, 1, 1]
    assert len(came_after) == 2  # the formula was final at its closing `$$`, mid-stream
    assert renderer.final_html() == render_markdown(text)


# --- link references: the one thing blocks cannot know in advance -----------------------------


def test_a_reference_defined_after_its_use_makes_the_renderer_fall_back() -> None:
    text = "See [the docs][d].\n\nMore text.\n\n[d]: https://example.com/docs\n"
    renderer, blocks, _ = stream(tokens(text))
    assert not renderer.whole_matches
    assert "".join(b.html for b in blocks) != render_markdown(text)  # the link came too late
    assert renderer.final_html() == render_markdown(text)
    assert 'href="https://example.com/docs"' in renderer.final_html()


def test_whole_matches_is_true_when_no_reference_is_defined() -> None:
    renderer, _, _ = stream(tokens("[not a ref] and [x](https://example.com)\n\n[x]\n"))
    assert renderer.whole_matches


# --- misuse gets a clear error ------------------------------------------------------------------


def test_feeding_after_finish_is_an_error() -> None:
    renderer = LiveRenderer()
    renderer.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        renderer.feed("more")
    with pytest.raises(RuntimeError, match="twice"):
        renderer.finish()


def test_final_html_before_finish_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before finish"):
        LiveRenderer().final_html()


# --- chunking never matters: property test -----------------------------------------------------

WORD = st.sampled_from(
    ["alpha", "beta", "**bold**", "*em*", "`code`", "$x^2$", "$5 and $10", "\\(a+b\\)",
     "[link](https://example.com)", "~~gone~~", "a|b", "x", "7", "$", "[r]", "[see][link]"]
)  # fmt: skip
TEXT = st.lists(WORD, min_size=1, max_size=6).map(" ".join)
LINES = st.lists(TEXT, min_size=1, max_size=3)


@st.composite
def blocks_of_markdown(draw: st.DrawFn, references: bool) -> str:
    kind = draw(
        st.sampled_from(
            ["heading", "setext", "para", "list", "ordered", "quote", "table", "fence",
             "tilde", "indented", "math", "math1", "bracket", "hr", "unclosed"]
            + (["refdef"] if references else [])
        )
    )  # fmt: skip
    if kind == "heading":
        return "#" * draw(st.integers(1, 6)) + " " + draw(TEXT)
    if kind == "setext":
        return draw(TEXT) + "\n" + draw(st.sampled_from(["===", "---"]))
    if kind == "para":
        return "\n".join(draw(LINES))
    if kind in ("list", "ordered"):
        markers = ["- ", "* ", "+ "] if kind == "list" else ["1. ", "2) ", "10. "]
        marker = draw(st.sampled_from(markers))
        items = [
            marker + draw(TEXT) + draw(st.sampled_from(["", "\n  more", "\n\n  para", "\nlazy"]))
            for _ in range(draw(st.integers(1, 4)))
        ]
        return draw(st.sampled_from(["\n", "\n\n"])).join(items)
    if kind == "quote":
        return "\n".join(draw(st.sampled_from(["> ", ">", ""])) + t for t in draw(LINES))
    if kind == "table":
        rows = "\n".join(f"| {draw(TEXT)} | {draw(TEXT)} |" for _ in range(draw(st.integers(0, 3))))
        return f"| {draw(TEXT)} | h |\n|:--|--:|\n{rows}".rstrip("\n")
    if kind in ("fence", "tilde"):
        fence = "```" if kind == "fence" else "~~~~"
        body = "\n".join(
            draw(st.lists(st.sampled_from(["x = 1", "", "```", "  ~~~", "$$"]), max_size=4))
        )
        return f"{fence}{draw(st.sampled_from(['', 'python', 'js']))}\n{body}\n{fence}"
    if kind == "indented":
        return "\n".join("    " + t for t in draw(LINES))
    if kind == "math":
        return (
            "$$\n"
            + "\n".join(draw(st.lists(st.sampled_from(["a^2", "\\frac{1}{2}", "x"]), max_size=3)))
            + "\n$$"
        )
    if kind == "math1":
        return draw(st.sampled_from(["$$E = mc^2$$", "$$\\frac{$$", "\\[ a+b \\]", "$$ x $$ tail"]))
    if kind == "bracket":
        return "\\[\n" + draw(st.sampled_from(["a", "\\sum_i i", "\\left("])) + "\n\\]"
    if kind == "hr":
        return draw(st.sampled_from(["***", "---", "___", "- - -"]))
    if kind == "unclosed":
        return draw(st.sampled_from(["$$\n\\alpha", "```\ncode", "\\[\nb"]))
    return (
        f"[{draw(st.sampled_from(['r', 'link']))}]: https://example.com/{draw(st.integers(0, 9))}"
    )


def documents(references: bool) -> st.SearchStrategy[str]:
    separator = st.sampled_from(["\n\n", "\n\n", "\n", "\n\n\n"])
    return st.lists(
        st.tuples(blocks_of_markdown(references), separator), min_size=1, max_size=8
    ).map(lambda parts: "".join(block + sep for block, sep in parts))


SPLITS = st.lists(st.integers(0, 10_000), max_size=30)


# database=None: no .hypothesis/ example store written into the repository.
@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(documents(references=False), SPLITS, SPLITS, st.booleans())
def test_any_chunking_gives_the_same_blocks_and_they_add_up_to_the_whole_render(
    text: str, cuts_a: list[int], cuts_b: list[int], crlf: bool
) -> None:
    if crlf:
        text = text.replace("\n", "\r\n")
    renderer, blocks, _ = stream([text])
    assert stream(cut(text, cuts_a))[1] == blocks
    assert stream(cut(text, cuts_b))[1] == blocks
    assert stream(list(text))[1] == blocks
    # No reference was defined, so the check must hold, and hold for real.
    assert renderer.whole_matches
    assert "".join(b.html for b in blocks) == render_markdown(text)
    assert_blocks_tile_the_answer(text, blocks)
    for block in blocks:  # a block is self-contained: its source alone renders to it
        assert render_markdown(text[block.start : block.end]) == block.html


@settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(documents(references=True), SPLITS)
def test_with_references_the_blocks_still_do_not_depend_on_chunking_and_the_check_is_honest(
    text: str, cuts: list[int]
) -> None:
    renderer, blocks, _ = stream([text])
    assert stream(cut(text, cuts))[1] == blocks
    if renderer.whole_matches:
        assert "".join(b.html for b in blocks) == render_markdown(text)
    assert renderer.final_html() == render_markdown(text)


def test_a_block_returned_by_feed_is_final_for_any_text_that_follows() -> None:
    # Blocks returned mid-stream are the same as those of the whole answer: no later text
    # changed them. Checked on a long generated answer cut at random places.
    text = markdown_answer(3000, seed=7)
    _, whole, _ = stream([text])
    rng = random.Random(3)
    for _ in range(5):
        cuts = [rng.randrange(len(text)) for _ in range(rng.randint(10, 400))]
        pieces = cut(text, cuts)
        _, blocks, came_after = stream(pieces)
        assert blocks == whole
        fed = 0
        for block, n in zip(blocks, came_after, strict=False):
            fed = sum(map(len, pieces[: n + 1]))
            assert block.end <= fed  # never a block whose text had not fully arrived
        assert len(came_after) >= len(whole) - 1  # all but the last came out mid-stream
