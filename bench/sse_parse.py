"""Benchmark: our SSE parser (chat/upstream/sse.py) against httpx-sse on an OpenAI-style stream.

A stream of N small events as the demo model sends them (role chunk, one chunk per token,
finish, usage, [DONE]) is cut into random-sized reads, then parsed
  - "core": the parsers alone (ours on bytes; httpx-sse's line + event decoders after the
    incremental UTF-8 decoding that httpx's aiter_text does for it);
  - "httpx": through an httpx.Response fed by an async byte stream, the way the upstream
    client reads it (ours: aiter_bytes + feed; httpx-sse: EventSource.aiter_sse).
Two read regimes: "per-token" reads of 40-400 bytes (a paced model: about one event per
read) and "bulk" reads of 1-16384 bytes (a fast model, or a proxy that buffers).

    .venv/bin/python bench/sse_parse.py [--events 5000] [--repeat 7]

Prints the median time per run and per event. A benchmark, not a test: numbers vary by machine.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
from httpx_sse import EventSource
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chat.demo_upstream import DemoModel
from chat.upstream.sse import SSEParser
from tests.demo_server import call_demo_app


def make_stream(events: int) -> bytes:
    payload = {
        "model": "demo-full",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"/long {events - 4}"}],
    }
    app = DemoModel(ttfb_ms=0, tokens_per_second=0)
    response = asyncio.run(call_demo_app(app, "POST", "/v1/chat/completions", payload))
    return response.body


def cut(stream: bytes, low: int, high: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    reads, i = [], 0
    while i < len(stream):
        size = rng.randint(low, high)
        reads.append(stream[i : i + size])
        i += size
    return reads


def ours_core(reads: list[bytes]) -> int:
    parser = SSEParser()
    count = 0
    for read in reads:
        count += len(parser.feed(read))
    return count


def httpx_sse_core(reads: list[bytes]) -> int:
    text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines, events = SSELineDecoder(), SSEDecoder()
    count = 0
    for read in reads:
        for line in lines.decode(text_decoder.decode(read)):
            if events.decode(line) is not None:
                count += 1
    return count


async def _byte_stream(reads: list[bytes]) -> AsyncIterator[bytes]:
    for read in reads:
        yield read


def _response(reads: list[bytes]) -> httpx.Response:
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=_byte_stream(reads)
    )


async def ours_httpx(reads: list[bytes]) -> int:
    parser = SSEParser()
    count = 0
    async for read in _response(reads).aiter_bytes():
        count += len(parser.feed(read))
    return count


async def httpx_sse_httpx(reads: list[bytes]) -> int:
    count = 0
    async for _ in EventSource(_response(reads)).aiter_sse():
        count += 1
    return count


def timed(run: Callable[[], int], repeat: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    stream = make_stream(args.events)
    print(f"stream: {len(stream)} bytes, Python {sys.version.split()[0]}")
    header = ("regime", "path", "parser", "reads", "events", "ms/run", "µs/event")
    print("{:<10} {:<6} {:<10} {:>6} {:>7} {:>8} {:>9}".format(*header))
    for regime, low, high in (("per-token", 40, 400), ("bulk", 1, 16384)):
        reads = cut(stream, low, high)
        runs: list[tuple[str, str, Callable[[], int]]] = [
            ("core", "ours", lambda r=reads: ours_core(r)),
            ("core", "httpx-sse", lambda r=reads: httpx_sse_core(r)),
            ("httpx", "ours", lambda r=reads: asyncio.run(ours_httpx(r))),
            ("httpx", "httpx-sse", lambda r=reads: asyncio.run(httpx_sse_httpx(r))),
        ]
        for path, name, run in runs:
            seconds, count = timed(run, args.repeat)
            print(
                f"{regime:<10} {path:<6} {name:<10} {len(reads):>6} {count:>7} "
                f"{seconds * 1000:>8.2f} {seconds / count * 1e6:>9.2f}"
            )


if __name__ == "__main__":
    main()
