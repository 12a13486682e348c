"""Benchmark: what the limiter adds to each chat turn (admit, resize, settle), Redis and memory.

Usage: .venv/bin/python bench/limiter_cost.py [--calls 5000] [--redis redis://127.0.0.1:6379/0]
Prints a Markdown table; docs/decisions/rate-limiting.md quotes it. Not a test: timings vary
with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-not-a-secret")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402

from chat.limits.limiter import Admission, Limiter  # noqa: E402
from chat.limits.plans import UserLimits  # noqa: E402

# The shipped defaults: two windows, a daily quota and two streams, so every step runs.
LIMITS = UserLimits(
    rate="20/minute;500/day",
    daily_tokens=200_000,
    max_streams=2,
    plan="bench",
    allow_full_on_mobile=False,
)
USERS = 500  # calls spread over users so no one hits 20/minute: the admitted path


async def resolve(user_id: int) -> UserLimits:
    return LIMITS


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_turn(limiter: Limiter, user: int) -> tuple[float, float, float, float]:
    """A turn under a quota as the product makes it: admitted for the new text and a whole
    answer, fitted to its prompt once known (one resize), settled. Returns the step times."""
    t0 = time.perf_counter()
    admission = await limiter.admit(user, estimate_tokens=600, at_least=40)
    t1 = time.perf_counter()
    assert isinstance(admission, Admission), admission
    await admission.resize(700)
    t2 = time.perf_counter()
    await admission.settle(250)
    t3 = time.perf_counter()
    return t0, t1, t2, t3


async def sequential(limiter: Limiter, calls: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"admit": [], "resize": [], "settle": [], "turn": []}
    for i in range(calls):
        t0, t1, t2, t3 = await one_turn(limiter, i % USERS)
        times["admit"].append((t1 - t0) * 1e6)
        times["resize"].append((t2 - t1) * 1e6)
        times["settle"].append((t3 - t2) * 1e6)
        times["turn"].append((t3 - t0) * 1e6)
    return times


async def concurrent(limiter: Limiter, calls: int, tasks: int) -> float:
    """Turns (admit, resize, settle) per second with `tasks` turns in flight at once."""

    async def worker(offset: int) -> None:
        for i in range(offset, calls, tasks):
            await one_turn(limiter, USERS + i % USERS)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(tasks)))
    return calls / (time.perf_counter() - t0)


async def measure(name: str, url: str, calls: int) -> list[str]:
    prefix = f"bench:limiter:{uuid.uuid4().hex}:"
    limiter = Limiter(url, prefix=prefix, limits_resolver=resolve, failure="closed")
    try:
        # Warm up: connections, script loading (EVALSHA caches), code paths.
        warm = Limiter(url, prefix=prefix + "warm:", limits_resolver=resolve, failure="closed")
        await sequential(warm, 200)
        await warm.aclose()
        times = await sequential(limiter, calls)
        rate = await concurrent(limiter, calls, tasks=50)
    finally:
        await limiter.aclose()
        if url:
            client = redis.Redis.from_url(url)
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
    rows = []
    for step, samples in times.items():
        rows.append(
            f"| {name} | {step} | {pct(samples, 0.5):.0f} | {pct(samples, 0.95):.0f} | "
            f"{pct(samples, 0.99):.0f} | {statistics.fmean(samples):.0f} |"
        )
    rows.append(f"| {name} | 50 turns in flight | {rate:,.0f} turns/s | | | |")
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    r = redis.Redis.from_url(args.redis)
    version = r.info("server")["redis_version"]
    r.close()
    print(
        f"{args.calls} sequential turns (admit, resize, settle) per backend, {USERS} users, "
        f"limits {LIMITS.rate}, {LIMITS.daily_tokens} tokens/day, {LIMITS.max_streams} streams; "
        f"Python {platform.python_version()}, Redis {version} on localhost, {platform.machine()}"
    )
    print()
    print("| backend | step | p50 µs | p95 µs | p99 µs | mean µs |")
    print("|---|---|---:|---:|---:|---:|")
    for name, url in (("memory", ""), ("redis", args.redis)):
        for row in await measure(name, url, args.calls):
            print(row)


if __name__ == "__main__":
    asyncio.run(main())
