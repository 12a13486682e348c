"""Math in answers: `$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]` parsed by markdown-it, shown as MathML."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from xml.etree.ElementTree import Element

from latex2mathml.converter import convert_to_element
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from mdit_py_plugins.dollarmath import dollarmath_plugin

from chat.rendering.code import codeblock

__all__ = ["MATH_MAX_CHARS", "math_plugin", "mathml"]

# A formula longer than this is shown as code: latex2mathml costs ~16 µs a character, and no
# formula a reader can take in is this long.
MATH_MAX_CHARS = 4000
# Inline `\(…\)` / `\[…\]` look no further than this for their closer, so a paragraph full of
# openers costs linear time, not quadratic.
_INLINE_SEARCH_CHARS = MATH_MAX_CHARS + 2
# Macro definitions expand (up to latex2mathml's depth limit of 100, each as large as the
# formula): a cheap way to make one formula cost seconds. A chat answer does not need them.
_MACRO_DEFINITION_RE = re.compile(
    r"\\(?:(?:re)?newcommand|def|let|DeclareMathOperator)(?![a-zA-Z])"
)
_TAG_RE = re.compile(r"[a-z]+\Z")
# latex2mathml writes characters as `&#x…;` into element text and later unescapes its whole
# output, markup included (`\text{<b>}` comes out as a live `<b>`). We serialise its tree
# ourselves instead, turning only these references into characters and escaping the rest.
_CHAR_REF_RE = re.compile(r"&#x([0-9A-Fa-f]{1,6});")


def _char(match: re.Match[str]) -> str:
    code = int(match.group(1), 16)
    valid = 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF
    return chr(code) if valid else "\N{REPLACEMENT CHARACTER}"


def _text(value: str | None) -> str:
    return html.escape(_CHAR_REF_RE.sub(_char, value), quote=True) if value else ""


def _serialise(element: Element, out: list[str]) -> None:
    tag = element.tag
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise ValueError(f"unexpected MathML tag {tag!r}")
    # xmlns is dropped: the HTML parser puts <math> in the MathML namespace by itself.
    attrs = "".join(
        f' {name}="{_text(value)}"'
        for name, value in element.attrib.items()
        if name != "xmlns" and _TAG_RE.match(name)
    )
    out.append(f"<{tag}{attrs}>{_text(element.text)}")
    for child in element:
        _serialise(child, out)
    out.append(f"</{tag}>{_text(element.tail)}")


def mathml(latex: str, *, display: bool) -> str | None:
    """LaTeX as a `<math>` element, or None when it cannot be shown as math (never raises).

    The result still goes through the sanitiser with the rest of the answer.
    """
    if len(latex) > MATH_MAX_CHARS or _MACRO_DEFINITION_RE.search(latex):
        return None
    try:
        element = convert_to_element(latex, display="block" if display else "inline")
        out: list[str] = []
        _serialise(element, out)
    except Exception:  # latex2mathml raises many types on bad LaTeX (and RecursionError)
        return None
    return "".join(out)


def _inline_source(token: Token) -> str:
    closer = {"\\(": "\\)", "\\[": "\\]"}.get(token.markup, token.markup)
    return f"{token.markup}{token.content}{closer}"


def _render_inline(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    display = token.type == "math_inline_double"  # `$$…$$` or `\[…\]` inside a paragraph
    rendered = mathml(token.content.strip(), display=display)
    if rendered is None:  # bad LaTeX reads as what was written, as code
        return f"<code>{html.escape(_inline_source(token), quote=False)}</code>"
    # A span, not a div: this sits inside a <p>. CSS makes it a block that scrolls sideways.
    return f'<span class="math-display">{rendered}</span>' if display else rendered


def _render_block(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    if not token.meta["closed"]:  # a `$$5 million` never closed is most likely text
        return f"<p>{html.escape(token.markup + token.content, quote=False)}</p>\n"
    rendered = mathml(token.content.strip(), display=True)
    if rendered is None:  # bad LaTeX: the source, as a LaTeX code block
        return codeblock(token.content.strip("\n") + "\n", "latex")
    return f'<div class="math-display">{rendered}</div>\n'


def _math_block(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
    """`$$` or `\\[` at the start of a block, up to the line that ends with `$$` / `\\]`.

    Like a code fence, it is decided line by line (which live rendering relies on): it ends at
    its closing line, at a blank line (LaTeX allows none in a formula) or where its container
    ends, closed or not. Unlike a fence it does not interrupt a paragraph: `$$` on a line of
    its own right after text is display math inside that paragraph, and a stray `$$5` there
    stays text.
    """
    if state.is_code_block(start_line):
        return False
    first = state.src[
        state.bMarks[start_line] + state.tShift[start_line] : state.eMarks[start_line]
    ]
    opener = first[:2]
    closer = {"$$": "$$", "\\[": "\\]"}.get(opener)
    if closer is None:
        return False
    rest = first[2:].rstrip(" \t")
    closed = closer in rest
    if closed and (not rest.endswith(closer) or closer in rest[:-2]):
        return False  # `$$a$$ more text` is a paragraph with inline math in it
    if silent:
        return True
    lines = [rest[:-2] if closed else rest]
    line = start_line + 1
    while not closed and line < end_line:
        if state.isEmpty(line) or state.sCount[line] < state.blkIndent:
            break
        text = state.getLines(line, line + 1, state.blkIndent, False).rstrip(" \t")
        line += 1
        closed = text.endswith(closer)
        lines.append(text[:-2] if closed else text)
    state.line = line
    token = state.push("math_block", "math", 0)
    token.block = True
    token.content = "\n".join(lines)
    token.markup = opener
    token.map = [start_line, line]
    token.meta = {"closed": closed}
    return True


def _on_its_own_line(src: str, start: int, end: int) -> bool:
    """Is src[start:end] alone on its line(s), give or take spaces?"""
    while start > 0 and src[start - 1] in " \t":
        start -= 1
    while end < len(src) and src[end] in " \t":
        end += 1
    return (start == 0 or src[start - 1] == "\n") and (end == len(src) or src[end] == "\n")


def _math_inline_bracket(state: StateInline, silent: bool) -> bool:
    """`\\(…\\)` (inline) and `\\[…\\]` (display, inside a paragraph, on lines of its own).

    `\\[` is also how markdown escapes a bracket (`\\[citation needed\\]`, `\\[a\\](url)`): inside
    a line it stays that; display math is written on lines of its own.
    """
    opener = state.src[state.pos : state.pos + 2]
    if opener not in ("\\(", "\\["):
        return False
    closer = "\\)" if opener == "\\(" else "\\]"
    start = state.pos + 2
    # Searches that found no closer are remembered (no closer in src[low:high]), so that a
    # paragraph of many openers is scanned once, not once per opener.
    memo_key = f"math_no_closer{closer}"
    memo = state.env.get(memo_key)
    search_from = start
    if memo is not None and memo[0] is state.src and memo[1] <= start < memo[2]:
        search_from = memo[2] - 1  # a closer may straddle the end of the searched part
    limit = min(start + _INLINE_SEARCH_CHARS, len(state.src))
    end = state.src.find(closer, search_from, limit)
    if end < 0:
        low = memo[1] if search_from != start and memo is not None else start
        state.env[memo_key] = (state.src, low, limit)
        return False
    if not state.src[start:end].strip():
        return False
    if opener == "\\[" and not _on_its_own_line(state.src, state.pos, end + 2):
        return False
    if not silent:
        token = state.push("math_inline" if opener == "\\(" else "math_inline_double", "math", 0)
        token.content = state.src[start:end]
        token.markup = opener
    state.pos = end + 2
    return True


def math_plugin(md: MarkdownIt) -> None:
    """Adds the four math notations to a MarkdownIt, rendered by `mathml`."""
    # dollarmath's inline rule follows pandoc's: no space inside the dollars and no digit after
    # the closing one, so "$5 and $10" stays text. Its block rule is replaced by ours.
    dollarmath_plugin(
        md, allow_labels=False, allow_space=False, allow_digits=False, double_inline=True
    )
    md.block.ruler.at("math_block", _math_block)
    md.inline.ruler.before("escape", "math_inline_bracket", _math_inline_bracket)
    md.add_render_rule("math_inline", _render_inline)
    md.add_render_rule("math_inline_double", _render_inline)
    md.add_render_rule("math_block", _render_block)
