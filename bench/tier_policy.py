"""Benchmark: what the device tier policy costs per request, cached and uncached, Rust vs Python.

Run from the repository root: `.venv/bin/python bench/tier_policy.py [--rounds N]`.
It prints a markdown table (µs per call) for docs/decisions/device-tiers.md. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
os.environ.setdefault("DJANGO_DEBUG", "1")  # a benchmark needs no secret key

import django  # noqa: E402

django.setup()

from chat.tiers import devices as tiers  # noqa: E402
from chat.tiers.devices import device_class  # noqa: E402
from chat.tiers.hints import signals_from_headers  # noqa: E402
from chat.tiers.policy import Policy, decide  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "user_agents.tsv"


def load_user_agents() -> list[str]:
    with CORPUS.open(encoding="utf-8", newline="") as f:
        lines = (line for line in f if not line.startswith("#"))
        return [row["user_agent"] for row in csv.DictReader(lines, delimiter="\t")]


def time_each(
    calls: Sequence[Callable[[], object]], before: Callable[[], None] | None
) -> list[float]:
    """µs per call, one sample per call (for calls slow enough to time one by one)."""
    samples = []
    for call in calls:
        if before is not None:
            before()
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def time_batched(calls: Sequence[Callable[[], object]], repeat: int) -> list[float]:
    """µs per call, one sample per call site averaged over `repeat` runs (for sub-µs calls)."""
    samples = []
    for call in calls:
        start = time.perf_counter_ns()
        for _ in range(repeat):
            call()
        samples.append((time.perf_counter_ns() - start) / 1000 / repeat)
    return samples


def row(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    mean = statistics.fmean(ordered)
    return f"| {name} | {len(ordered)} | {p50:.2f} | {p95:.2f} | {mean:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="passes over the corpus")
    args = parser.parse_args()
    uas = load_user_agents()
    policy = Policy.default()
    headers = [{"user-agent": ua, "sec-ch-ua-mobile": "?0", "save-data": "on"} for ua in uas]

    start = time.perf_counter()
    rust = tiers.build_parser("rust")
    rust_build_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    python = tiers.build_parser("python")
    python_build_ms = (time.perf_counter() - start) * 1000
    # Warm both (the pure-Python resolver compiles its regexes lazily on first use).
    for ua in uas:
        tiers.classify_device(ua, rust)
        tiers.classify_device(ua, python)
    disagreements = [
        ua for ua in uas if tiers.classify_device(ua, rust) != tiers.classify_device(ua, python)
    ]

    rounds = args.rounds
    lines = [
        "| what | calls | p50 µs | p95 µs | mean µs |",
        "|---|---:|---:|---:|---:|",
    ]
    # Uncached: what the first request with a new User-Agent pays.
    lines.append(
        row(
            "device_class, uncached (cache_clear), ua-parser-rs",
            time_each(
                [lambda ua=ua: device_class(ua) for ua in uas] * rounds, device_class.cache_clear
            ),
        )
    )
    lines.append(
        row(
            "classify_device, pure-Python resolver",
            time_each(
                [lambda ua=ua: tiers.classify_device(ua, python) for ua in uas]
                * max(1, rounds // 10),
                None,
            ),
        )
    )
    lines.append(
        row(
            "classify_device, ua-parser-rs resolver",
            time_each([lambda ua=ua: tiers.classify_device(ua, rust) for ua in uas] * rounds, None),
        )
    )
    # Cached: what every later request with that User-Agent pays.
    for ua in uas:
        device_class(ua)
    lines.append(
        row(
            "device_class, cached",
            time_batched([lambda ua=ua: device_class(ua) for ua in uas], 2000),
        )
    )
    lines.append(
        row(
            "signals_from_headers + decide, cached UA",
            time_batched(
                [lambda h=h: decide(signals_from_headers(h, {}), policy) for h in headers], 500
            ),
        )
    )
    lines.append(
        row(
            "signals_from_headers + decide, uncached UA",
            time_each(
                [lambda h=h: decide(signals_from_headers(h, {}), policy) for h in headers] * rounds,
                device_class.cache_clear,
            ),
        )
    )
    # The policy's own cache hit: a clock comparison, no thread hop, no query.
    tiers._cache = tiers._Cached(policy, float("inf"))  # primed without a database
    loop = asyncio.new_event_loop()
    lines.append(
        row(
            "await aload_policy(), cache hit",
            time_batched([lambda: loop.run_until_complete(tiers.aload_policy())] * 50, 2000),
        )
    )
    loop.close()
    baseline_loop = asyncio.new_event_loop()

    async def nothing() -> None:
        return None

    lines.append(
        row(
            "(baseline: run_until_complete of an empty coroutine)",
            time_batched([lambda: baseline_loop.run_until_complete(nothing())] * 50, 2000),
        )
    )
    baseline_loop.close()

    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor()}")
    print(f"device_class uses: {tiers.resolver_name()}")
    print(f"corpus: {len(uas)} User-Agents; {rounds} rounds")
    print(
        f"parser build: ua-parser-rs {rust_build_ms:.0f} ms, pure Python {python_build_ms:.0f} ms"
    )
    print(f"resolvers disagree on {len(disagreements)} of {len(uas)} User-Agents")
    for ua in disagreements:
        print(f"  {ua}")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
