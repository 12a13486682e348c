"""Markdown-heavy answers for the live-rendering tests: the demo model's own (`/markdown <n>`)."""

from chat.demo_upstream.markdown import markdown_answer, tokens

__all__ = ["markdown_answer", "tokens"]
