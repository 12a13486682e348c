"""Turns model output (markdown, hostile) and user messages (plain text) into safe HTML.

`render_markdown` renders a whole answer; `LiveRenderer` renders one block by block while it
streams, with the same result. `sanitise_html` is the one sanitiser both go through.
"""

from chat.rendering.code import HIGHLIGHT_MAX_CHARS, highlight
from chat.rendering.live import Block, LiveRenderer, RenderStats
from chat.rendering.markdown import render_markdown, render_plain
from chat.rendering.sanitiser import ALLOWED_URL_SCHEMES, is_allowed_url, sanitise_html

__all__ = [
    "ALLOWED_URL_SCHEMES",
    "HIGHLIGHT_MAX_CHARS",
    "Block",
    "LiveRenderer",
    "RenderStats",
    "highlight",
    "is_allowed_url",
    "render_markdown",
    "render_plain",
    "sanitise_html",
]
