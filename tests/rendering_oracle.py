"""The XSS oracle for rendered answers: the payload corpus and a checker of what HTML is safe.

Shared by the rendering tests (whole answers, live blocks, math). The allow-list is written
out here on purpose rather than imported from chat.rendering: if the module's list ever grew
an `img`, a `style` or an `href` on MathML, these tests must fail.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from pygments.token import STANDARD_TYPES

ROOT = Path(__file__).resolve().parents[1]
PAYLOADS_FILE = ROOT / "tests" / "data" / "xss_payloads.txt"

MATHVARIANT = {"mathvariant"}
MO_ATTRIBUTES = {
    "mathvariant", "form", "stretchy", "fence", "largeop", "movablelimits", "separator",
    "symmetric", "accent", "lspace", "rspace", "minsize", "maxsize",
}  # fmt: skip
TABLE_LIST_ATTRIBUTES = {"columnalign", "rowalign", "columnspacing", "rowspacing"}
ALLOWED_ATTRIBUTES: dict[str, set[str]] = {
    **{tag: set() for tag in ("p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6")},
    **{tag: set() for tag in ("strong", "em", "s", "blockquote", "ul", "li")},
    **{tag: set() for tag in ("table", "thead", "tbody", "tr")},
    "a": {"href", "title", "target", "rel"},
    "ol": {"start"},
    "div": {"class", "data-lang"},
    "pre": {"class"},
    "code": {"class"},
    "span": {"class"},
    "th": {"class"},
    "td": {"class"},
    # MathML: presentation only. No href (MathML 3 put one on every element), no style,
    # no class or id, no semantics/annotation-xml (an HTML integration point), no maction.
    "math": {"display"},
    **{tag: set() for tag in ("mrow", "msqrt", "mroot", "merror", "mphantom", "msub", "msup")},
    **{tag: set() for tag in ("msubsup", "mmultiscripts", "mprescripts")},
    **{tag: set(MATHVARIANT) for tag in ("mi", "mn", "mtext", "ms")},
    "mo": MO_ATTRIBUTES,
    "mspace": {"width", "height", "depth"},
    "mpadded": {"width", "height", "depth"},
    "mfrac": {"linethickness"},
    "mstyle": {"displaystyle", "scriptlevel", "mathcolor", "mathsize"},
    "mover": {"accent"},
    "munder": {"accentunder"},
    "munderover": {"accent", "accentunder"},
    "mtable": TABLE_LIST_ATTRIBUTES | {"columnlines", "rowlines"},
    "mtr": {"columnalign", "rowalign"},
    "mtd": {"columnalign", "rowalign", "columnspan", "rowspan"},
    "menclose": {"notation"},
}
ALIGN_CLASSES = {"align-left", "align-center", "align-right"}
ALLOWED_CLASS = {
    "div": lambda cls: cls in {"codeblock", "codeblock-bar", "math-display"},
    "pre": lambda cls: cls == "code",
    "code": lambda cls: re.fullmatch(r"language-[a-z0-9][a-z0-9+#._-]*", cls) is not None,
    "span": lambda cls: (
        cls in (set(STANDARD_TYPES.values()) - {""}) | {"codeblock-lang", "math-display"}
    ),
    "th": lambda cls: cls in ALIGN_CLASSES,
    "td": lambda cls: cls in ALIGN_CLASSES,
}
ALLOWED_SCHEMES = {"http", "https", "mailto"}
SAFE_REL = "noopener noreferrer nofollow"


def load_records(path: Path) -> list[str]:
    """Records separated by `%%%` lines; the text before the first separator is a comment."""
    text = path.read_text(encoding="utf-8")
    records = re.split(r"^%%%$", text, flags=re.MULTILINE)[1:]
    return [record.strip("\n") for record in records if record.strip("\n")]


PAYLOADS = load_records(PAYLOADS_FILE)


def url_scheme(url: str) -> str | None:
    """The scheme a browser would see: it strips C0/space at the ends and tab/CR/LF inside."""
    cleaned = re.sub(r"[\t\n\r]", "", url.strip("".join(map(chr, range(0x21))))).lower()
    match = re.match(r"([a-z][a-z0-9+.\-]*):", cleaned)
    return match.group(1) if match else None


class UnsafeHtmlFinder(HTMLParser):
    """Parses rendered HTML (entities decoded, as a browser would) and lists what is unsafe."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ALLOWED_ATTRIBUTES:
            self.problems.append(f"tag <{tag}> is not allowed")
            return
        for name, value in attrs:
            value = value or ""
            if name.startswith("on"):
                self.problems.append(f"event handler {name} on <{tag}>")
            elif name not in ALLOWED_ATTRIBUTES[tag]:
                self.problems.append(f"attribute {name} on <{tag}> is not allowed")
            elif name == "class":
                bad = [cls for cls in value.split() if not ALLOWED_CLASS[tag](cls)]
                if bad:
                    self.problems.append(f"class {bad} on <{tag}>")
            elif name == "href":
                scheme = url_scheme(value)
                if scheme in {"javascript", "data", "vbscript"}:
                    self.problems.append(f"dangerous href {value!r}")
                elif scheme not in ALLOWED_SCHEMES:
                    self.problems.append(f"href {value!r} is not absolute http(s)/mailto")
            elif name == "rel" and value != SAFE_REL:
                self.problems.append(f"rel {value!r} on <{tag}>")
            elif name == "target" and value != "_blank":
                self.problems.append(f"target {value!r} on <{tag}>")

    def handle_comment(self, data: str) -> None:
        self.problems.append(f"comment {data!r}")

    def handle_decl(self, decl: str) -> None:
        self.problems.append(f"declaration {decl!r}")

    def unknown_decl(self, data: str) -> None:
        self.problems.append(f"declaration {data!r}")

    def handle_pi(self, data: str) -> None:
        self.problems.append(f"processing instruction {data!r}")


def unsafe_parts(rendered: str) -> list[str]:
    problems = []
    # Substring checks too, in case a parser quirk hides a tag from HTMLParser.
    if "<script" in rendered.lower():
        problems.append("<script in output")
    if "<img" in rendered.lower():
        problems.append("<img in output")
    finder = UnsafeHtmlFinder()
    finder.feed(rendered)
    finder.close()
    return problems + finder.problems


class ElementCollector(HTMLParser):
    """The start tags of a fragment with their attributes, for asserting on benign output."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))


def elements(rendered: str, tag: str) -> list[dict[str, str | None]]:
    collector = ElementCollector()
    collector.feed(rendered)
    return [attrs for name, attrs in collector.elements if name == tag]
