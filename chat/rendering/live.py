"""Live rendering of a streaming answer: each top-level markdown block rendered once, when final.

A block is final when a later top-level block has begun, or when nothing can extend it any
more (a heading, a rule, a closed code fence or formula, a paragraph, table or quote followed
by a blank line). Only complete lines count: the text after the last line break is still
being written. Where blocks begin and end depends on the text alone, never on how it was cut
into chunks, because CommonMark decides block structure line by line and our extensions keep
that property (see docs/decisions/rendering.md).

Cost is linear in the answer. Only the open tail (from the first block that is not final) is
ever parsed again, and only when a newly completed line could have ended its open block: a
line is judged against that block's kind (a fence waits for its closing fence, a list for a
line outside it, a paragraph for a blank line or a line that can interrupt it). A parse that
finds nothing final makes the next one wait until the tail has grown by half, which bounds
the work of any input, however hostile, to a small multiple of its length. Each final block
is rendered (parsed in full, highlighted, sanitised) exactly once.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from chat.rendering.markdown import BLOCK_PARSER, INLINE_PASS, MARKDOWN, render_markdown
from chat.rendering.sanitiser import sanitise_html

__all__ = ["Block", "LiveRenderer", "RenderStats"]

_LINE_END_RE = re.compile(r"\r\n|\r|\n")  # markdown-it's own notion of a line break
# Lines that could begin a block which ends (or interrupts) the open one. A superset is fine:
# a line wrongly thought to end a block costs one parse, and the backoff bounds those.
_BLOCK_START_RE = re.compile(
    r" {0,3}(?:#{1,6}(?:[ \t]|$)|>|```|~~~|[-+*](?:[ \t]|$)|\d{1,9}[.)](?:[ \t]|$)"
    r"|(?:[-*_=][ \t]*)+$)"
)
_DELIMITER_ROW_RE = re.compile(r"[ \t]*[|:-][-|: \t]*$")  # a table's second line
_HR_RE = re.compile(r" {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
_LIST_ITEM_RE = re.compile(r"( {0,3})([-+*]|\d{1,9}[.)])(?:([ \t]+)|$)")
_QUOTE_LINE_RE = re.compile(r" {0,3}>")


@dataclass(frozen=True, slots=True)
class Block:
    """One top-level block of an answer, final, as sanitised HTML.

    `start`/`end` are offsets into the answer in Python characters (code points: a browser's
    UTF-16 offsets differ after an astral character such as an emoji). Block 0 starts at 0
    and each block starts where the one before it ended, so the blocks cover the answer from
    its beginning up to the last block's `end`; what follows holds no HTML (blank lines, link
    definitions).
    """

    index: int
    start: int
    end: int
    html: str


@dataclass(slots=True)
class RenderStats:
    """The work done so far, counted (not timed) so that tests can hold it to linear."""

    parses: int = 0  # boundary parses of the open tail
    parsed_chars: int = 0  # characters handed to those parses
    rendered_blocks: int = 0  # blocks inline-parsed, rendered and sanitised (each once)


class _Open(enum.Enum):
    """The kind of the open (last, not final) block, which says what line could end it."""

    NONE = "none"
    PARAGRAPH = "paragraph"
    TABLE = "table"
    QUOTE = "quote"
    LIST = "list"
    CODE = "code"  # indented
    FENCE = "fence"
    MATH = "math"


_OPEN_KINDS = {
    "paragraph_open": _Open.PARAGRAPH,
    "table_open": _Open.TABLE,
    "blockquote_open": _Open.QUOTE,
    "bullet_list_open": _Open.LIST,
    "ordered_list_open": _Open.LIST,
    "code_block": _Open.CODE,
    "fence": _Open.FENCE,
    "math_block": _Open.MATH,
}


def _indent(body: str) -> int:
    columns = 0
    for char in body:
        if char == " ":
            columns += 1
        elif char == "\t":
            columns += 4 - columns % 4
        else:
            break
    return columns


def _top_level(tokens: list[Token]) -> list[tuple[int, int]]:
    """The token ranges [first, last + 1) of each top-level block."""
    groups: list[tuple[int, int]] = []
    start = 0
    for i, token in enumerate(tokens):
        if token.level != 0:
            continue
        if token.nesting == 1:
            start = i
        elif token.nesting == 0:
            groups.append((i, i + 1))
        else:
            groups.append((start, i + 1))
    return groups


def _is_done(first: Token, end_line: int, lines: int) -> bool:
    """Can nothing after the text so far extend this block, the last one found?"""
    if first.type in ("heading_open", "hr"):
        return True
    if first.type in ("fence", "math_block") and first.meta.get("closed"):
        return True
    # Only blank lines (or link definitions) follow it: a blank line ends these for good.
    return first.type in ("paragraph_open", "table_open", "blockquote_open", "math_block") and (
        end_line < lines
    )


def _offsets(lines: list[str], base: int) -> list[int]:
    """Where each line starts (and, last, where the text ends), as offsets from `base`."""
    offsets = [base]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    return offsets


class LiveRenderer:
    """Renders one answer block by block as it streams: `feed` each chunk, then `finish`.

    Feed it the chunk texts in order; every block it returns is final (its HTML never
    changes). After `finish`, `final_html()` is the answer's HTML: the blocks joined when
    `whole_matches`, else a whole-document render (see `whole_matches`).
    """

    def __init__(self) -> None:
        self.stats = RenderStats()
        self._parts: list[str] = []  # the answer as fed
        self._next_index = 0
        self._next_start = 0  # where the next block starts (the last block's end)
        self._tail_start = 0  # where the open tail (its first line) starts in the answer
        self._lines: list[str] = []  # the complete lines of the open tail
        self._lines_chars = 0
        self._partial: list[str] = []  # the line still being written
        self._cr_pending = False  # a chunk ended in "\r": half of a "\r\n"?
        self._html: list[str] = []
        self._references = False
        self._finished = False
        # The open block as of the last parse, and what the lines since then said about it.
        self._open = _Open.NONE
        self._prev_blank = True
        self._fence_close: re.Pattern[str] | None = None
        self._math_closer = ""
        self._list_marker = ""
        self._list_indent = 0
        self._backoff = 0  # a judged parse waits until the tail has this many characters
        self._forced_fruitless = False

    @property
    def text(self) -> str:
        """The answer so far."""
        return "".join(self._parts)

    @property
    def open_chars(self) -> int:
        """How many characters of the answer are in no block yet (what a parse would read)."""
        return self._lines_chars + sum(map(len, self._partial))

    def open_text_has(self, *needles: str) -> bool:
        """Does the open tail (the text in no block yet) hold any of these strings?"""
        parts = (*self._lines, "".join(self._partial))
        return any(needle in part for part in parts for needle in needles)

    @property
    def whole_matches(self) -> bool:
        """Do the blocks joined equal `render_markdown` of the whole answer?

        False once the answer defines a link reference (`[x]: https://…`): a definition
        changes links in blocks rendered before it arrived. Final only after `finish`.
        """
        return not self._references

    def feed(self, text: str) -> list[Block]:
        """Take the next chunk of the answer; return the blocks that became final with it."""
        if self._finished:
            raise RuntimeError("LiveRenderer.feed() after finish(): the answer is complete")
        if not text:
            return []
        self._parts.append(text)
        if not self._cr_pending and "\n" not in text and "\r" not in text:
            self._partial.append(text)  # most chunks: a few words of the line being written
            return []
        forced = judged = False
        for line in self._take_lines(text):
            force, judge = self._judge(line)
            forced, judged = forced or force, judged or judge
            self._lines.append(line)
            self._lines_chars += len(line)
        if forced and not self._forced_fruitless:
            return self._parse(forced=True)
        if (forced or judged) and self._lines_chars >= self._backoff:
            return self._parse(forced=forced)
        return []

    def finish(self) -> list[Block]:
        """The answer is complete: return every block not returned yet (the last may be open).

        These blocks are final only because the text ends: an answer continued later (the
        `continue` frame) may extend them, so render a continuation with a new LiveRenderer
        fed the whole text (the blocks `feed` returned come out the same).
        """
        if self._finished:
            raise RuntimeError("LiveRenderer.finish() called twice")
        self._finished = True
        rest = self._lines + (["".join(self._partial)] if self._partial else [])
        self._lines, self._partial = [], []
        tokens, groups = self._block_parse(rest)
        return self._render(rest, tokens, groups)

    def final_html(self) -> str:
        """The answer's HTML after `finish`: its blocks joined, or a whole render if they differ."""
        if not self._finished:
            raise RuntimeError("LiveRenderer.final_html() before finish()")
        return "".join(self._html) if self.whole_matches else render_markdown(self.text)

    def _take_lines(self, text: str) -> list[str]:
        """The lines this chunk completes, each with its line break (each character once)."""
        lines: list[str] = []
        start = 0
        if self._cr_pending:
            self._cr_pending = False
            if text.startswith("\n"):
                self._partial.append("\n")
                start = 1
            lines.append("".join(self._partial))
            self._partial = []
        for match in _LINE_END_RE.finditer(text, start):
            if match.group() == "\r" and match.end() == len(text):
                self._cr_pending = True  # decided by the next chunk
                break
            self._partial.append(text[start : match.end()])
            lines.append("".join(self._partial))
            self._partial = []
            start = match.end()
        if start < len(text):
            self._partial.append(text[start:])
        return lines

    def _judge(self, line: str) -> tuple[bool, bool]:
        """(forced, judged): does this line end the open block for sure, or possibly?"""
        body = line.rstrip("\r\n")
        blank = not body.strip(" \t")
        prev_blank, self._prev_blank = self._prev_blank, blank
        kind = self._open
        if kind is _Open.FENCE:
            return self._fence_close is not None and bool(self._fence_close.match(body)), False
        if kind is _Open.MATH:
            return blank or body.rstrip(" \t").endswith(self._math_closer), False
        if blank:
            return kind in (_Open.PARAGRAPH, _Open.TABLE, _Open.QUOTE), False
        if kind is _Open.NONE:
            return False, True
        if kind is _Open.PARAGRAPH:
            return False, bool(_BLOCK_START_RE.match(body) or _DELIMITER_ROW_RE.match(body))
        if kind is _Open.TABLE:
            return False, bool(_BLOCK_START_RE.match(body)) or _indent(body) >= 4
        if kind is _Open.QUOTE:
            return False, not _QUOTE_LINE_RE.match(body)
        if kind is _Open.CODE:
            return False, _indent(body) < 4
        return False, self._ends_list(body, prev_blank)

    def _ends_list(self, body: str, prev_blank: bool) -> bool:
        if _indent(body) >= self._list_indent:
            return False  # inside the last item
        if _HR_RE.match(body):
            return True
        item = _LIST_ITEM_RE.match(body)
        # A bullet list's markup is its bullet; an ordered list's, its delimiter ("." or ")").
        if item and item.group(2)[-1] == self._list_marker:
            self._list_indent = self._content_indent(item)
            return False  # the list's next item
        # Plain text right after a line of the list continues its paragraph (lazily).
        return prev_blank or bool(_BLOCK_START_RE.match(body))

    @staticmethod
    def _content_indent(item: re.Match[str]) -> int:
        spaces = len(item.group(3) or "")
        return len(item.group(1)) + len(item.group(2)) + (spaces if 1 <= spaces <= 4 else 1)

    def _parse(self, *, forced: bool) -> list[Block]:
        """Find the final blocks at the front of the open tail; render and return them."""
        tokens, groups = self._block_parse(self._lines)
        final = len(groups) - 1
        if groups and _is_done(
            tokens[groups[-1][0]], self._map(tokens, groups[-1])[1], len(self._lines)
        ):
            final += 1
        if final <= 0:  # nothing final: wait for more text before asking again
            self._backoff = self._lines_chars + self._lines_chars // 2 + 1
            self._forced_fruitless = forced
            self._note_open(tokens, groups[-1] if groups else None)
            return []
        self._backoff, self._forced_fruitless = 0, False
        consumed = self._map(tokens, groups[final - 1])[1]
        self._note_open(tokens, groups[final] if final < len(groups) else None)
        region, self._lines = self._lines[:consumed], self._lines[consumed:]
        self._lines_chars -= sum(map(len, region))
        return self._render(region, tokens, groups[:final])

    def _block_parse(self, lines: list[str]) -> tuple[list[Token], list[tuple[int, int]]]:
        """The block tokens of these lines, and the token range of each top-level block."""
        src = "".join(lines)
        env: dict[str, object] = {}
        tokens = BLOCK_PARSER.parse(src, env)
        self.stats.parses += 1
        self.stats.parsed_chars += len(src)
        self._references = self._references or bool(env.get("references"))
        return tokens, _top_level(tokens)

    @staticmethod
    def _map(tokens: list[Token], group: tuple[int, int]) -> list[int]:
        token_map = tokens[group[0]].map
        if token_map is None:  # every block token markdown-it makes has a map
            raise ValueError(f"markdown-it block token without a line map: {tokens[group[0]]}")
        return token_map

    def _note_open(self, tokens: list[Token], group: tuple[int, int] | None) -> None:
        """Remember the open block's kind and what would end it (before lines are dropped)."""
        first = tokens[group[0]] if group else None
        self._open = _OPEN_KINDS.get(first.type, _Open.NONE) if first else _Open.NONE
        if first is None or group is None:
            return
        if self._open is _Open.FENCE:
            marker, length = re.escape(first.markup[0]), len(first.markup)
            self._fence_close = re.compile(rf" {{0,3}}{marker}{{{length},}}[ \t]*$")
        elif self._open is _Open.MATH:
            self._math_closer = "$$" if first.markup == "$$" else "\\]"
        elif self._open is _Open.LIST:
            self._list_marker = first.markup  # "-", "+", "*", or "." / ")" for ordered lists
            items = [
                t.map[0]
                for t in tokens[group[0] : group[1]]
                if t.type == "list_item_open" and t.level == 1 and t.map
            ]
            item = _LIST_ITEM_RE.match(self._lines[items[-1]].rstrip("\r\n")) if items else None
            self._list_indent = self._content_indent(item) if item else 2

    def _render(
        self, lines: list[str], tokens: list[Token], groups: list[tuple[int, int]]
    ) -> list[Block]:
        """Finish these blocks' tokens (inline parsing, the answer policy) and render each once.

        The inline pass gets an env without link references: a reference resolves in a block
        only by the whole-document fallback, so a block's HTML never depends on where the
        chunks fell (which definitions happened to be parsed with it).
        """
        offsets = _offsets(lines, self._tail_start)
        self._tail_start = offsets[-1]
        if not groups:
            return []
        env: dict[str, object] = {}
        INLINE_PASS.core.process(StateCore("", INLINE_PASS, env, tokens[: groups[-1][1]]))
        blocks: list[Block] = []
        for first, stop in groups:
            end = offsets[min(self._map(tokens, (first, stop))[1], len(lines))]
            rendered = MARKDOWN.renderer.render(tokens[first:stop], MARKDOWN.options, env)
            html = sanitise_html(rendered)
            blocks.append(Block(self._next_index, self._next_start, end, html))
            self.stats.rendered_blocks += 1
            self._html.append(html)
            self._next_index += 1
            self._next_start = end
        return blocks
