"""Markdown-heavy answers, made up deterministically: the demo model's `/markdown <n>`, and the
live-rendering tests and benchmarks.

`markdown_answer(tokens)` writes what a chat model writes at length: headings, paragraphs on
one long line each, bullet and numbered lists (some nested, some loose), quotes, tables,
inline and display math, and a fenced code block every few hundred tokens. `tokens` cuts a
text into pieces about the size of a model's tokens (up to four characters, with the
whitespace before them), the way the chunks of a turn arrive.
"""

from __future__ import annotations

import random
import re

_WORDS = [
    "the", "answer", "stream", "block", "render", "token", "chunk", "quota", "tier",
    "model", "user", "reply", "list", "table", "code", "value", "result", "first", "then",
    "next", "because", "which", "while", "every", "about", "would", "could", "other",
    "their", "simple", "linear", "browser", "server", "parser", "heading", "paragraph",
    "formula", "example", "approach"
]  # fmt: skip
_TOKEN_RE = re.compile(r"\s*\S{1,4}|\s+")
_CODE = [
    "def total(items):\n    return sum(item.price for item in items if item.price > 0)\n",
    "for (let i = 0; i < rows.length; i++) {\n  render(rows[i]);\n}\n",
    "SELECT id, title FROM chat_conversation WHERE user_id = %s ORDER BY updated DESC;\n",
    'fn main() {\n    println!("{}", 1 + 2);\n}\n',
]
_LANGS = ["python", "js", "sql", "rust"]


def tokens(text: str) -> list[str]:
    """The text in model-token-sized pieces; joined they give the text back."""
    return _TOKEN_RE.findall(text)


def _sentence(rng: random.Random, words: int) -> str:
    picked = [rng.choice(_WORDS) for _ in range(words)]
    if rng.random() < 0.3:
        i = rng.randrange(len(picked))
        picked[i] = f"**{picked[i]}**"
    if rng.random() < 0.2:
        i = rng.randrange(len(picked))
        picked[i] = f"`{picked[i]}()`"
    if rng.random() < 0.15:
        picked.append("$x_i^2 + \\frac{a}{b}$")
    return " ".join(picked).capitalize() + "."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng, rng.randint(6, 16)) for _ in range(rng.randint(2, 5)))


def _block(rng: random.Random, n: int) -> str:
    kind = rng.choice(["para", "para", "list", "ordered", "quote", "table", "math", "heading"])
    if kind == "heading":
        return f"{'#' * rng.randint(1, 3)} {_sentence(rng, 4)[:-1]}"
    if kind == "list":
        items = [f"- {_sentence(rng, rng.randint(4, 10))}" for _ in range(rng.randint(3, 7))]
        if rng.random() < 0.3:
            items.insert(1, f"  - {_sentence(rng, 5)}")
        return "\n".join(items)
    if kind == "ordered":
        sep = "\n\n" if rng.random() < 0.3 else "\n"  # loose lists too
        steps = [f"{i}. {_sentence(rng, rng.randint(4, 10))}" for i in range(1, rng.randint(3, 6))]
        return sep.join(steps)
    if kind == "quote":
        return "\n".join(f"> {_sentence(rng, 8)}" for _ in range(rng.randint(1, 3)))
    if kind == "table":
        rows = [
            f"| {rng.choice(_WORDS)} | {rng.randint(1, 999)} |" for _ in range(rng.randint(2, 6))
        ]
        return "| name | value |\n|:--|--:|\n" + "\n".join(rows)
    if kind == "math":
        return f"$$\n\\sum_{{i=1}}^{{{n}}} i^2 = \\frac{{n(n+1)(2n+1)}}{{6}}\n$$"
    return _paragraph(rng)


def markdown_answer(token_count: int, seed: int = 1, code_every: int = 300) -> str:
    """About `token_count` tokens of markdown, a code block every ~`code_every` tokens."""
    rng = random.Random(seed)
    parts: list[str] = []
    count = since_code = 0
    while count < token_count:
        if since_code >= code_every:
            i = rng.randrange(len(_CODE))
            block = f"```{_LANGS[i]}\n{_CODE[i] * rng.randint(1, 4)}```"
            since_code = 0
        else:
            block = _block(rng, len(parts))
        size = len(tokens(block))
        parts.append(block)
        count += size
        since_code += size
    return "\n\n".join(parts) + "\n"
