"""Code blocks in answers: pygments highlighting with CSS classes, and the labelled wrapper."""

from __future__ import annotations

import functools
import html
import re

from markdown_it.common.utils import escapeHtml
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import find_lexer_class_by_name

from chat.rendering.sanitiser import CANONICAL_ALIAS

__all__ = ["HIGHLIGHT_MAX_CHARS", "codeblock", "highlight", "lang_label"]

# Code larger than this is shown escaped but not highlighted: pygments lexers are regex
# machines, and a hostile answer picks both the language and the text (ReDoS), so the cost of
# highlighting is capped per block.
HIGHLIGHT_MAX_CHARS = 64 * 1024

_LANG_LABEL_RE = re.compile(r"[^\w+#.\-]")

# No linenos, no wrapping: we write the <pre><code> ourselves; spans carry CSS classes only
# (the stylesheet is static/chat/highlight.css), never inline styles.
_FORMATTER = HtmlFormatter(nowrap=True)


@functools.lru_cache(maxsize=64)  # keyed by canonical alias only: bounded by pygments itself
def _lexer_class(canonical_alias: str) -> type[Lexer]:
    return find_lexer_class_by_name(canonical_alias)


def highlight(code: str, lang: str, attrs: str = "") -> str:
    """markdown-it's `highlight` hook: a `<pre class="code"><code>` block, pygments spans inside.

    Unknown languages (and very large blocks) are escaped plainly, without a language class.
    """
    canonical = CANONICAL_ALIAS.get(lang.strip().lower())
    if canonical is None or len(code) > HIGHLIGHT_MAX_CHARS:
        return f'<pre class="code"><code>{html.escape(code, quote=False)}</code></pre>'
    # stripnl=False: leading blank lines are part of what the copy button copies.
    lexer = _lexer_class(canonical)(stripnl=False)
    spans = pygments_highlight(code, lexer, _FORMATTER)
    return f'<pre class="code"><code class="language-{canonical}">{spans}</code></pre>'


def lang_label(info: str) -> str:
    """The first word of a fence's info string, reduced to a short, inert label."""
    words = info.split(maxsplit=1)
    return _LANG_LABEL_RE.sub("", words[0])[:32] if words else ""


def codeblock(code: str, lang: str) -> str:
    """A code block in its wrapper: a bar with the language label, then the code.

    The bar is where the UI's copy button goes, so the button never covers code; the label
    sits in the bar as text (readable, selectable, announced) rather than CSS `content`.
    """
    label = f'<span class="codeblock-lang">{escapeHtml(lang)}</span>' if lang else ""
    return (
        f'<div class="codeblock" data-lang="{escapeHtml(lang)}">'
        f'<div class="codeblock-bar">{label}</div>{highlight(code, lang)}</div>\n'
    )
