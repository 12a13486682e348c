"""The one sanitiser: the allow-list (HTML and MathML) that decides what HTML reaches the page."""

from __future__ import annotations

import re

import nh3
from pygments.lexers import LEXERS
from pygments.token import STANDARD_TYPES

__all__ = ["ALLOWED_URL_SCHEMES", "CANONICAL_ALIAS", "is_allowed_url", "sanitise_html"]

# Only these schemes may appear in an href. Relative URLs are refused too: a model has no
# business linking into our own site (`/accounts/logout/`), and `//host` is protocol-relative.
ALLOWED_URL_SCHEMES = frozenset({"http", "https", "mailto"})
_SCHEME_RE = re.compile(r"^([a-z][a-z0-9+.\-]*):", re.IGNORECASE)

# pygments alias (lower case) -> the lexer's first alias, which names the `language-…` class.
CANONICAL_ALIAS: dict[str, str] = {
    alias.lower(): aliases[0]
    for _module, _name, aliases, _files, _mimes in LEXERS.values()
    if aliases
    for alias in aliases
}

# The markdown renderer can only produce these tags, and raw HTML in the answer is shown as
# text (html=False): nh3 is the second, independent lock.
_HTML_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6",
    "strong", "em", "s", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "table", "thead", "tbody", "tr", "th", "td", "div", "span",
}  # fmt: skip

# MathML Core's presentation elements that latex2mathml emits (plus menclose, which Chromium
# lays out as an mrow). Never: semantics, annotation(-xml) (an HTML integration point),
# maction, mglyph, or any attribute that holds a URL (MathML 3's `href`).
_MATH_TAGS = {
    "math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "mfrac", "msqrt", "mroot",
    "mstyle", "merror", "mpadded", "mphantom", "msub", "msup", "msubsup", "munder", "mover",
    "munderover", "mmultiscripts", "mprescripts", "mtable", "mtr", "mtd", "menclose",
}  # fmt: skip

_ALLOWED_ATTRIBUTES: dict[str, set[str]] = {
    "a": {"href", "title"},
    "ol": {"start"},
    "div": {"data-lang"},
    # MathML attributes whose values are lengths or keyword lists (no URL, no script, no
    # CSS: the strict CSP needs no `style`). The enumerable ones are in _ALLOWED_VALUES.
    "mspace": {"width", "height", "depth"},
    "mpadded": {"width", "height", "depth"},  # not lspace/voffset: they move ink outside
    "mo": {"lspace", "rspace", "minsize", "maxsize"},
    "mfrac": {"linethickness"},
    "mstyle": {"mathcolor", "mathsize"},
    "mtable": {"columnalign", "rowalign", "columnspacing", "rowspacing", "columnlines", "rowlines"},
    "mtr": {"columnalign", "rowalign"},
    "mtd": {"columnalign", "rowalign", "columnspan", "rowspan"},
    "menclose": {"notation"},
}
_BOOLEAN = {"true", "false"}
_MATHVARIANTS = {
    "normal", "bold", "italic", "bold-italic", "double-struck", "bold-fraktur", "script",
    "bold-script", "fraktur", "sans-serif", "bold-sans-serif", "sans-serif-italic",
    "sans-serif-bold-italic", "monospace",
}  # fmt: skip
_ALLOWED_VALUES: dict[str, dict[str, set[str]]] = {
    "math": {"display": {"inline", "block"}},
    "mi": {"mathvariant": _MATHVARIANTS},
    "mn": {"mathvariant": _MATHVARIANTS},
    "mtext": {"mathvariant": _MATHVARIANTS},
    "ms": {"mathvariant": _MATHVARIANTS},
    "mo": {
        "mathvariant": _MATHVARIANTS,
        "form": {"prefix", "infix", "postfix"},
        **dict.fromkeys(
            ("stretchy", "fence", "largeop", "movablelimits", "separator", "symmetric", "accent"),
            _BOOLEAN,
        ),
    },
    "mstyle": {"displaystyle": _BOOLEAN, "scriptlevel": {"0", "1", "2", "+1", "-1"}},
    "mover": {"accent": _BOOLEAN},
    "munder": {"accentunder": _BOOLEAN},
    "munderover": {"accent": _BOOLEAN, "accentunder": _BOOLEAN},
}

# `class` is never allowed as such: nh3 keeps only these exact class names per tag.
_ALIGN_CLASSES = {"align-left", "align-center", "align-right"}
_ALLOWED_CLASSES = {
    "div": {"codeblock", "codeblock-bar", "math-display"},
    "pre": {"code"},
    "code": {f"language-{alias}" for alias in set(CANONICAL_ALIAS.values())},
    "span": {cls for cls in STANDARD_TYPES.values() if cls} | {"codeblock-lang", "math-display"},
    "th": _ALIGN_CLASSES,
    "td": _ALIGN_CLASSES,
}
_CLEANER = nh3.Cleaner(
    tags=_HTML_TAGS | _MATH_TAGS,
    clean_content_tags={"script", "style"},
    attributes=_ALLOWED_ATTRIBUTES,
    tag_attribute_values=_ALLOWED_VALUES,
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


def sanitise_html(fragment: str) -> str:
    """Run an HTML fragment through the allow-list (also used directly by the XSS tests)."""
    return _CLEANER.clean(fragment)
