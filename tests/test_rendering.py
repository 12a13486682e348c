"""Tests for chat.rendering: model output becomes safe HTML, benign markdown still renders."""

from __future__ import annotations

import html
import re
import runpy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.rendering import (
    HIGHLIGHT_MAX_CHARS,
    highlight,
    render_markdown,
    render_plain,
    sanitise_html,
)
from tests.rendering_oracle import PAYLOADS, SAFE_REL, elements, unsafe_parts

ROOT = Path(__file__).resolve().parents[1]


# --- the oracle itself must be able to fail -------------------------------------------------


@pytest.mark.parametrize(
    "unsafe",
    [
        "<img src=x>",
        "<SCRIPT>x</SCRIPT>",
        "<svg></svg>",
        '<p onclick="x">',
        '<p style="color:red">',
        '<a href=" jav&#x09;ascript:alert(1)">',
        '<a href="DATA:text/html,x">',
        '<a href="/accounts/logout/">',
        '<a href="https://x" rel="opener">',
        '<span class="evil">',
        "<!-- x -->",
    ],
)
def test_the_checker_flags_unsafe_html(unsafe: str) -> None:
    assert unsafe_parts(unsafe)


def test_the_checker_accepts_a_safe_link() -> None:
    safe = f'<p><a href="https://example.com/" rel="{SAFE_REL}" target="_blank">x</a></p>'
    assert unsafe_parts(safe) == []


def test_the_corpus_has_at_least_150_distinct_payloads() -> None:
    assert len(set(PAYLOADS)) >= 150


# --- hostile input ---------------------------------------------------------------------------

payload_params = pytest.mark.parametrize(
    "payload", PAYLOADS, ids=[f"payload{n:03d}" for n in range(len(PAYLOADS))]
)


@payload_params
def test_an_answer_carrying_a_payload_renders_inert(payload: str) -> None:
    assert unsafe_parts(render_markdown(payload)) == []


@payload_params
def test_the_sanitiser_alone_neutralises_a_payload_given_as_raw_html(payload: str) -> None:
    # The second lock on its own: even if markdown-it let raw HTML through, nh3 would not.
    assert unsafe_parts(sanitise_html(payload)) == []


@payload_params
def test_a_user_message_carrying_a_payload_is_only_text(payload: str) -> None:
    rendered = render_plain(payload)
    assert not set("<>\"'") & set(rendered)
    assert html.unescape(rendered) == payload


CONTROL_CHARACTERS = [chr(c) for c in (*range(0x00, 0x21), 0x7F, 0xA0, 0x200B, 0xFEFF)]


@pytest.mark.parametrize(
    "char", CONTROL_CHARACTERS, ids=[f"U+{ord(c):04X}" for c in CONTROL_CHARACTERS]
)
@pytest.mark.parametrize(
    "template",
    [
        "[a]({c}javascript:alert(1))",
        "[a](<{c}javascript:alert(1)>)",
        "[a](<java{c}script:alert(1)>)",
        "![a](<{c}javascript:alert(1)>)",
        "<{c}javascript:alert(1)>",
        '<a href="{c}javascript:alert(1)">x</a>',
        '<a href="java{c}script:alert(1)">x</a>',
    ],
)
def test_control_and_invisible_characters_do_not_smuggle_a_javascript_url(
    template: str, char: str
) -> None:
    payload = template.format(c=char)
    assert unsafe_parts(render_markdown(payload)) == []
    assert unsafe_parts(sanitise_html(payload)) == []


FRAGMENTS = [
    "[", "]", "(", ")", "!", "<", ">", "/", '"', "'", "`", "```", "~~~", "\n", "\n\n", " ",
    "\t", "    ", "*", "_", "~~", "|", "|---|", "- ", "1. ", "# ", "> ", "\\", "=", ":",
    "javascript:", "JaVaScRiPt:", "data:text/html,", "vbscript:", "&#106;", "&colon;", "&#x3A;",
    "&#9;", "%0a", "\u200b", "alert(1)", "onerror=", "onload=", "<img src=x ", "<script>",
    "</script>", "<svg ", "<a href=", "<iframe srcdoc=", "https://x.example/", "mailto:a@b.c",
    "a@b.c", "[r]: ", "[r]", "<!--", "-->", "<![CDATA[", "python", "x",
]  # fmt: skip


# database=None: no .hypothesis/ example store written into the repository.
@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_any_mix_of_markdown_and_attack_fragments_renders_inert(text: str) -> None:
    assert unsafe_parts(render_markdown(text)) == []


# --- benign markdown still renders -----------------------------------------------------------


def test_headings_render() -> None:
    rendered = render_markdown("# Title\n\n## Part *one*\n")
    assert "<h1>Title</h1>" in rendered
    assert "<h2>Part <em>one</em></h2>" in rendered


def test_lists_render_with_their_start_number() -> None:
    rendered = render_markdown("- one\n- two\n\n3. three\n4. four\n")
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in rendered
    assert elements(rendered, "ol") == [{"start": "3"}]
    assert rendered.count("<li>") == 4


def test_tables_render_with_alignment_as_classes_not_styles() -> None:
    rendered = render_markdown("| a | b |\n|:--|--:|\n| 1 | 2 |\n")
    assert "<table>" in rendered
    assert elements(rendered, "th") == [{"class": "align-left"}, {"class": "align-right"}]
    assert elements(rendered, "td") == [{"class": "align-left"}, {"class": "align-right"}]
    assert "style" not in rendered


def test_emphasis_strong_and_strikethrough_render() -> None:
    rendered = render_markdown("*em* **strong** ~~gone~~")
    assert rendered == "<p><em>em</em> <strong>strong</strong> <s>gone</s></p>\n"


def test_block_quotes_render() -> None:
    assert render_markdown("> wise words\n") == "<blockquote>\n<p>wise words</p>\n</blockquote>\n"


def test_inline_code_is_escaped() -> None:
    assert render_markdown("use `a < b && c`") == "<p>use <code>a &lt; b &amp;&amp; c</code></p>\n"


def test_fenced_code_is_highlighted_with_classes_inside_a_codeblock_wrapper() -> None:
    rendered = render_markdown('```python\ndef f():\n    return "<b>"\n```\n')
    assert rendered.startswith(
        '<div class="codeblock" data-lang="python">'
        '<div class="codeblock-bar"><span class="codeblock-lang">python</span></div>'
        '<pre class="code"><code class="language-python"><span class="k">def</span>'
    )
    assert '<span class="s2">"&lt;b&gt;"</span>' in rendered
    assert rendered.endswith("</code></pre></div>\n")


def test_a_language_alias_gets_the_canonical_language_class_and_keeps_its_label() -> None:
    rendered = render_markdown("```py\nx = 1\n```\n")
    assert elements(rendered, "div") == [
        {"class": "codeblock", "data-lang": "py"},
        {"class": "codeblock-bar"},
    ]
    assert elements(rendered, "code") == [{"class": "language-python"}]


def test_an_unknown_language_is_escaped_plainly() -> None:
    rendered = render_markdown("```nosuchlanguage\n<b>x</b>\n```\n")
    assert rendered == (
        '<div class="codeblock" data-lang="nosuchlanguage"><div class="codeblock-bar">'
        '<span class="codeblock-lang">nosuchlanguage</span></div><pre class="code">'
        "<code>&lt;b&gt;x&lt;/b&gt;\n</code></pre></div>\n"
    )


def test_indented_code_gets_the_codeblock_wrapper_too() -> None:
    rendered = render_markdown("text\n\n    x = <y>\n")
    assert (
        '<div class="codeblock" data-lang=""><div class="codeblock-bar"></div>'
        '<pre class="code"><code>x = &lt;y&gt;'
    ) in rendered


def test_the_language_label_is_text_in_the_bar_above_the_code_not_over_it() -> None:
    # The bar comes before the <pre>: a copy button placed in it never covers code.
    rendered = render_markdown("```c++\nint x;\n```\n")
    bar = rendered.index('<div class="codeblock-bar">')
    assert bar < rendered.index("<pre")
    assert '<span class="codeblock-lang">c++</span>' in rendered[bar : rendered.index("<pre")]


def test_a_hostile_info_string_becomes_an_inert_short_label() -> None:
    rendered = render_markdown('```"><script>alert(1)</script>' + "x" * 80 + "\ncode\n```\n")
    assert unsafe_parts(rendered) == []
    labels = re.findall(r'<span class="codeblock-lang">([^<]*)</span>', rendered)
    assert len(labels) == 1
    assert len(labels[0]) <= 32 and re.fullmatch(r"[\w+#.\-]*", labels[0])


def test_a_code_block_over_the_highlighting_limit_is_escaped_but_not_highlighted() -> None:
    code = "x = '<a>'\n" * (HIGHLIGHT_MAX_CHARS // 10 + 1)
    rendered = highlight(code, "python")
    assert "<span" not in rendered
    assert rendered == f'<pre class="code"><code>{html.escape(code, quote=False)}</code></pre>'


def test_an_http_link_gets_rel_and_opens_in_a_new_tab() -> None:
    rendered = render_markdown('[docs](https://example.com/a?b=1&c=2 "The docs")')
    assert elements(rendered, "a") == [
        {
            "href": "https://example.com/a?b=1&c=2",
            "title": "The docs",
            "target": "_blank",
            "rel": SAFE_REL,
        }
    ]


def test_mailto_links_and_email_autolinks_render() -> None:
    rendered = render_markdown("[mail me](mailto:a@example.com) or <b@example.com>")
    assert [a["href"] for a in elements(rendered, "a")] == [
        "mailto:a@example.com",
        "mailto:b@example.com",
    ]
    assert all(a["rel"] == SAFE_REL for a in elements(rendered, "a"))


def test_a_link_with_a_disallowed_url_keeps_its_text_but_loses_the_anchor() -> None:
    for url in ("javascript:alert(1)", "/accounts/logout/", "ftp://example.com/f", "#top"):
        assert render_markdown(f"[click me]({url})") == "<p>click me</p>\n", url


def test_an_image_becomes_a_link_showing_its_alt_text() -> None:
    rendered = render_markdown('![a *chart*](https://example.com/c.png "Sales")')
    assert "<img" not in rendered
    assert elements(rendered, "a") == [
        {"href": "https://example.com/c.png", "title": "Sales", "target": "_blank", "rel": SAFE_REL}
    ]
    assert ">\N{FRAME WITH PICTURE} a chart</a>" in rendered


def test_an_image_without_alt_text_is_labelled_image() -> None:
    assert ">\N{FRAME WITH PICTURE} image</a>" in render_markdown("![](https://example.com/c.png)")


def test_an_image_with_a_disallowed_url_becomes_just_its_alt_text() -> None:
    for url in ("javascript:alert(1)", "data:image/png;base64,iVBORw0KGgo=", "/media/x.png"):
        assert render_markdown(f"![a <chart>]({url})") == "<p>a &lt;chart&gt;</p>\n", url


def test_raw_html_in_an_answer_is_shown_as_text() -> None:
    assert render_markdown("<b>hi</b>") == "<p>&lt;b&gt;hi&lt;/b&gt;</p>\n"


def test_a_user_message_is_escaped_and_keeps_its_newlines_as_characters() -> None:
    assert render_plain("a <b>\n  c & 'd'") == "a &lt;b&gt;\n  c &amp; &#x27;d&#x27;"


# --- the highlighting stylesheet -------------------------------------------------------------


def test_the_highlight_stylesheet_is_what_its_generator_writes() -> None:
    generator = runpy.run_path(str(ROOT / "scripts" / "highlight_css.py"))
    css_path = ROOT / "static" / "chat" / "highlight.css"
    assert css_path.read_text(encoding="utf-8") == generator["build_css"](), (
        "static/chat/highlight.css is stale: run scripts/highlight_css.py"
    )


def test_the_highlight_stylesheet_styles_keywords_in_every_theme_scope() -> None:
    css = (ROOT / "static" / "chat" / "highlight.css").read_text(encoding="utf-8")
    assert re.search(r"^\.code \.k\b", css, re.MULTILINE)
    assert re.search(r'^\[data-theme="dark"\] \.code \.k\b', css, re.MULTILINE)
    media = css[css.index("@media (prefers-color-scheme: dark)") :]
    assert ':root:not([data-theme="light"]) .code .k' in media
