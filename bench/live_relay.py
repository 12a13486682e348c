"""Benchmark: what live rendering adds to a turn's CPU per 1,000 relayed tokens (issue 15).

A turn used to render its answer once, at the end (`fragments.answer_html`, in a worker
thread). Now it feeds each chunk to `LiveBlocks` (chat/turns/live_blocks.py), which renders each
block once and builds its `block` frame; the joined blocks are the answer's HTML, so the whole
render is gone (unless the answer defines a link reference). This measures both on the same
answers, chunked as a turn chunks them:

  - the demo model's `/long` prose (what `make bench`'s relay cost streams) and a
    markdown-heavy answer (tests/markdown_answers.py: headings, lists, tables, math, code);
  - a chunk per token (the worst case: no coalescing) and chunks of 8 tokens.

    .venv/bin/python bench/live_relay.py [--tokens 20000] [--repeat 5]

Prints CPU ms (process time, median of the repeats) per 1,000 tokens: before (the whole render
at the end), after (feeding every chunk, the block frames, the end), and the difference. Divide
the difference by the relay's server CPU per 1,000 tokens (`make bench`, docs/benchmarks.md) for
the share of a turn's cost. A benchmark, not a test: numbers vary by machine and load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django

# The whole render goes through chat.fragments, which needs settings (no database is used).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
os.environ.setdefault("DJANGO_DEBUG", "1")
django.setup()

from chat.demo_upstream import long_tokens  # noqa: E402
from chat.fragments import answer_html  # noqa: E402
from chat.turns.live_blocks import LiveBlocks  # noqa: E402
from tests.markdown_answers import markdown_answer, tokens  # noqa: E402


def cpu_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def live(chunks: list[str]) -> int:
    blocks = LiveBlocks("bench")
    frames = 0
    for chunk in chunks:
        frames += len(blocks.feed_now(chunk))
    frames += len(blocks.finish_now())
    assert blocks.final_html is not None
    return frames


def frames_of(pieces: list[str], size: int) -> list[str]:
    return ["".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    answers = {
        "/long (prose)": long_tokens(args.tokens),
        "markdown-heavy": tokens(markdown_answer(args.tokens)),
    }
    print(f"CPU ms per 1,000 tokens (median of {args.repeat})")
    print("| answer | chunks | before: whole render | after: live blocks | difference |")
    print("|---|---|---|---|---|")
    for name, pieces in answers.items():
        text = "".join(pieces)
        per_k = 1000 / len(pieces)
        whole = cpu_ms(lambda: answer_html(text), args.repeat) * per_k  # noqa: B023
        for size in (1, 8):
            chunks = frames_of(pieces, size)
            after = cpu_ms(lambda: live(chunks), args.repeat) * per_k  # noqa: B023
            print(
                f"| {name} | {size} token{'s' if size > 1 else ''} | {whole:.1f} | {after:.1f} "
                f"| {after - whole:+.1f} |"
            )


if __name__ == "__main__":
    main()
