"""Benchmark: live (block by block) rendering of a streaming answer against one whole render.

Renders the same answers
  - "whole": `render_markdown` once, at the end (what a turn costs today);
  - "live/token": a LiveRenderer fed one model-sized token at a time, then finished;
  - "live/frame": fed in frames of 8 tokens (a coalesced socket frame at ~500 tokens/s);
  - "naive": the whole text so far re-rendered at every line break (what rendering on every
    chunk costs; shown on a shorter answer, since it grows with the square of the length).
Answers: a markdown-heavy 20,000-token answer (headings, lists, tables, quotes, math, code every
300 tokens; tests/markdown_answers.py), a 3,000-item list and a 200,000-character line.

    .venv/bin/python bench/live_render.py [--tokens 20000] [--repeat 5]

Prints CPU milliseconds (process time, median of the repeats) per run and per 1,000 tokens, and
the characters handed to the block parser per character of answer. A benchmark, not a test:
numbers vary by machine and load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chat.rendering import LiveRenderer, render_markdown
from chat.rendering.mathml import mathml
from tests.markdown_answers import markdown_answer, tokens


def cpu_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def live(pieces: list[str]) -> LiveRenderer:
    renderer = LiveRenderer()
    for piece in pieces:
        renderer.feed(piece)
    renderer.finish()
    renderer.final_html()
    return renderer


def naive(text: str) -> None:
    # Re-render everything so far whenever a line completes.
    end = text.find("\n")
    while end >= 0:
        render_markdown(text[: end + 1])
        end = text.find("\n", end + 1)
    render_markdown(text)


def frames(pieces: list[str], size: int) -> list[str]:
    return ["".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]


def report(name: str, text: str, repeat: int, naive_too: bool) -> None:
    pieces = tokens(text)
    per_k = 1000 / len(pieces)
    whole = cpu_ms(lambda: render_markdown(text), repeat)
    per_token = cpu_ms(lambda: live(pieces), repeat)
    per_frame = cpu_ms(lambda: live(frames(pieces, 8)), repeat)
    stats = live(pieces).stats
    print(f"\n{name}: {len(text):,} characters, {len(pieces):,} tokens")
    print(f"  {'path':<12} {'ms / run':>10} {'ms / 1k tokens':>15} {'vs whole':>9}")
    for path, ms in (("whole", whole), ("live/token", per_token), ("live/frame", per_frame)):
        print(f"  {path:<12} {ms:>10.1f} {ms * per_k:>15.2f} {ms / whole:>8.2f}x")
    print(
        f"  block parser saw {stats.parsed_chars / len(text):.2f} characters per character "
        f"in {stats.parses} parses; {stats.rendered_blocks} blocks rendered once each"
    )
    if naive_too:
        ms = cpu_ms(lambda: naive(text), 1)
        print(f"  {'naive':<12} {ms:>10.1f} {ms * per_k:>15.2f} {ms / whole:>8.2f}x")


def math_cost(repeat: int) -> None:
    formulas = [
        r"\frac{a}{b} + \sqrt{x^2+y^2} = \sum_{i=0}^{n} \alpha_i \int_0^\infty e^{-x} dx",
        r"E = mc^2",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        r"x = \frac{-b \pm \sqrt{b^2-4ac}}{2a}",
    ]
    rounds = 50
    ms = cpu_ms(lambda: [mathml(f, display=True) for _ in range(rounds) for f in formulas], repeat)
    size = sum(len(mathml(f, display=True) or "") for f in formulas)
    print(
        f"\nmath: latex2mathml + our serialiser, {ms / rounds / len(formulas):.2f} ms per formula "
        f"(4 formulas: {size:,} bytes of MathML before sanitising)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    answer = markdown_answer(args.tokens)
    live(tokens(answer))  # warm up: pygments lexers and regexes compile on first use
    report(f"markdown-heavy answer ({args.tokens:,} tokens)", answer, args.repeat, False)
    report("the same, 2,000 tokens", markdown_answer(2_000), args.repeat, True)
    items = "".join(f"- item number {i} with a few words\n" for i in range(3000)) + "\nEnd.\n"
    report("a 3,000-item list", items, args.repeat, False)
    report("a 200,000-character line", "word " * 40_000 + "\n", args.repeat, False)
    math_cost(args.repeat)


if __name__ == "__main__":
    main()
