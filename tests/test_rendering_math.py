"""Math in answers: four notations become MathML, text with dollars stays text, and nothing
a formula can say gets past the sanitiser (MathML included) or makes rendering raise."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import latex2mathml.commands
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.rendering import render_markdown, sanitise_html
from chat.rendering.mathml import MATH_MAX_CHARS, mathml
from tests.rendering_oracle import ROOT, elements, load_records, unsafe_parts


def maths(rendered: str) -> list[dict[str, str | None]]:
    return elements(rendered, "math")


# --- the four notations ---------------------------------------------------------------------


@pytest.mark.parametrize("text", ["$x^2$", "\\(x^2\\)"])
def test_inline_math_becomes_an_inline_math_element(text: str) -> None:
    rendered = render_markdown(f"Area is {text} here.")
    assert rendered == (
        '<p>Area is <math display="inline"><mrow><msup><mi>x</mi><mn>2</mn></msup></mrow>'
        "</math> here.</p>\n"
    )


@pytest.mark.parametrize(
    "text", ["$$\nE = mc^2\n$$", "\\[\nE = mc^2\n\\]", "$$E = mc^2$$", "\\[ E = mc^2 \\]"]
)
def test_display_math_on_its_own_lines_is_a_block_that_can_scroll_sideways(text: str) -> None:
    rendered = render_markdown(text)
    assert rendered.startswith('<div class="math-display"><math display="block">')
    assert "<msup><mi>c</mi><mn>2</mn></msup>" in rendered


def test_display_math_right_after_a_line_of_text_stays_in_that_paragraph() -> None:
    # `$$` cannot interrupt a paragraph (so a stray `$$` in prose cannot swallow what
    # follows), but it still shows as display math, in a span since it sits inside a <p>.
    rendered = render_markdown("The energy:\n$$\nE = mc^2\n$$\nas promised.")
    assert rendered.startswith("<p>The energy:\n")
    assert '<span class="math-display"><math display="block">' in rendered
    assert rendered.endswith("as promised.</p>\n")


@pytest.mark.parametrize(
    "text",
    [
        "It costs $5 and $10 later.",
        "Between $3 and $4.",
        "A $ sign alone",
        "Escaped \\$x\\$ dollars",
        "Spaced $ x $ is not math",
        "`$x$` in code",
    ],
)
def test_dollars_that_are_not_math_stay_text(text: str) -> None:
    assert maths(render_markdown(text)) == []


@pytest.mark.parametrize(
    "text", ["see \\[citation needed\\] here", "\\[a\\](https://example.com)", "\\[ a \\] b"]
)
def test_escaped_brackets_inside_a_line_stay_brackets(text: str) -> None:
    # `\[` is also markdown's escaped bracket; display math stands on lines of its own.
    rendered = render_markdown(text)
    assert maths(rendered) == []
    assert "[" in rendered


def test_math_in_a_code_block_is_code() -> None:
    rendered = render_markdown("```\n$x$ and $$y$$\n```\n")
    assert maths(rendered) == []
    assert "$x$ and $$y$$" in rendered


def test_a_display_formula_never_closed_is_shown_as_the_text_it_is() -> None:
    assert render_markdown("$$5 million\n\nnext") == "<p>$$5 million</p>\n<p>next</p>\n"
    assert render_markdown("$$\n<b>x") == "<p>$$\n&lt;b&gt;x</p>\n"


# --- bad LaTeX is shown as code, never raises -----------------------------------------------


@pytest.mark.parametrize(
    "latex",
    ["\\frac{", "\\left(", "\\begin{matrix}", "x^2^3", "{" * 3000 + "x" + "}" * 3000],
    ids=["open-brace", "left-without-right", "open-environment", "double-superscript", "deep"],
)
def test_bad_latex_inline_is_shown_as_code_with_its_dollars(latex: str) -> None:
    assert mathml(latex, display=False) is None
    rendered = render_markdown(f"see ${latex}$ here")
    assert maths(rendered) == []
    assert "<code>$" in rendered


def test_bad_latex_in_a_display_block_is_a_latex_code_block() -> None:
    rendered = render_markdown("$$\n\\frac{a}{\n$$\n")
    assert maths(rendered) == []
    assert elements(rendered, "div")[0] == {"class": "codeblock", "data-lang": "latex"}
    assert "\\frac" in rendered


def test_macro_definitions_and_huge_formulas_are_not_expanded() -> None:
    # \newcommand expands up to latex2mathml's depth limit, each time as large as the formula.
    assert mathml("\\newcommand{\\a}{xx}\\a\\a", display=False) is None
    assert mathml("\\def\\b{x}\\b", display=False) is None
    assert mathml("x+" * (MATH_MAX_CHARS // 2 + 1), display=False) is None
    assert mathml("x+" * 100 + "y", display=False) is not None


LATEX_PIECES = [
    r"\frac", r"\sqrt", "{", "}", "^", "_", "x", "2", r"\left(", r"\right)", "&", r"\\",
    r"\begin{matrix}", r"\end{matrix}", r"\text{", "<", ">", '"', r"\href{", r"\color{",
    r"\mathbb", r"\hline", r"\sum", r"\\[", "]", r"\operatorname", r"\over", r"\not"
]  # fmt: skip


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(LATEX_PIECES), max_size=20).map("".join))
def test_any_latex_renders_or_falls_back_and_is_always_inert(latex: str) -> None:
    for display in (False, True):
        rendered = mathml(latex, display=display)  # never raises
        if rendered is not None:
            assert unsafe_parts(sanitise_html(rendered)) == []
    assert unsafe_parts(render_markdown(f"${latex}$ and\n\n$$\n{latex}\n$$\n")) == []


# --- MathML through the one sanitiser ---------------------------------------------------------


def test_latex_text_with_markup_is_escaped_not_passed_through() -> None:
    # latex2mathml's own string output unescapes everything (`\text{<b>}` would be a live <b>).
    rendered = render_markdown("$\\text{<script>alert(1)</script><img src=x>}$")
    assert unsafe_parts(rendered) == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img&nbsp;src=x&gt;" in rendered  # text, shown


def test_a_link_color_box_or_style_in_latex_reaches_the_page_without_its_attribute() -> None:
    rendered = render_markdown(
        "$\\href{javascript:alert(1)}{x} \\colorbox{red}{y} \\style{position:fixed}{z}$"
    )
    assert unsafe_parts(rendered) == []
    for dropped in ("href", "javascript", "mathbackground", "style", "position"):
        assert dropped not in rendered


def test_colour_in_latex_is_kept_as_mathcolor() -> None:
    assert '<mstyle mathcolor="red">' in render_markdown("$\\color{red}{x}$")


class _TagsAndAttributes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.add((tag, ""))
        self.seen.update((tag, name) for name, _ in attrs)


def _seen(fragment: str) -> set[tuple[str, str]]:
    collector = _TagsAndAttributes()
    collector.feed(fragment)
    return collector.seen


# What the sanitiser strips from latex2mathml's output on purpose: URLs (MathML 3's href),
# CSS and classes (`\style`, `\class`), ink moved outside its box (lspace, voffset),
# backgrounds that could paint over the page, and MathML 3 leftovers Chromium ignores.
DROPPED_ON_PURPOSE = {
    ("mrow", "href"), ("mrow", "style"), ("mrow", "class"), ("mn", "style"), ("mn", "class"),
    ("mpadded", "lspace"), ("mpadded", "voffset"), ("mpadded", "mathbackground"),
    ("mspace", "mathbackground"), ("mspace", "linebreak"), ("mtable", "displaystyle"),
}  # fmt: skip


def test_everything_latex2mathml_emits_is_kept_or_dropped_on_purpose() -> None:
    # Every command latex2mathml knows, in a few shapes: when an upgrade starts emitting a
    # new element or attribute, this says whether the sanitiser would silently eat it.
    commands = sorted(
        {v for v in vars(latex2mathml.commands).values() if isinstance(v, str) and v[:1] == "\\"}
    )
    shapes = [f"{c}{{a}}{{b}}" for c in commands] + [f"x{c} y" for c in commands]
    environments = ["matrix", "pmatrix", "bmatrix", "vmatrix", "cases", "aligned", "array"]
    shapes += [f"\\begin{{{e}}}{{lc}}a&b\\\\\\hline c&d\\end{{{e}}}" for e in environments]
    emitted: set[tuple[str, str]] = set()
    kept: set[tuple[str, str]] = set()
    for shape in shapes:
        rendered = mathml(shape, display=True)
        if rendered is not None:
            emitted |= _seen(rendered)
            kept |= _seen(sanitise_html(rendered))
    assert len({tag for tag, _ in emitted}) >= 15  # the sample did reach most of MathML
    assert emitted - kept <= DROPPED_ON_PURPOSE, emitted - kept
    assert {tag for tag, _ in emitted} == {tag for tag, _ in kept}  # no element is lost


MUTATION_XSS = load_records(ROOT / "tests" / "data" / "mathml_xss_payloads.txt")


@pytest.mark.parametrize(
    "payload", MUTATION_XSS, ids=[f"mxss{n:02d}" for n in range(len(MUTATION_XSS))]
)
def test_mathml_namespace_confusion_does_not_get_through_the_sanitiser(payload: str) -> None:
    # Mutation XSS lives in what a second parse makes of the first one's output: check the
    # sanitised HTML, and what the sanitiser makes of it when parsed again.
    once = sanitise_html(payload)
    assert unsafe_parts(once) == []
    assert unsafe_parts(sanitise_html(once)) == []
    assert not re.search(r"<(mglyph|maction|semantics|annotation|svg|style|textarea)", once)
