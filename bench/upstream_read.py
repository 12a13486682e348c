"""What reading the model's SSE stream costs this process, per upstream client variant.

N concurrent answers (`/long <tokens>`, the demo model paced at 50 tokens/s after 100 ms)
read through `UpstreamClient` (chat/upstream/client.py) with different HTTP stacks
underneath, one variant after the other against the same model process; reports this process's
CPU (user + system) per 1,000 tokens and the time to first token. Nothing else runs in the
process: this isolates the upstream read path that the relay profile names as its largest cost.

    python -m bench.upstream_read --n 200 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

from chat.upstream.client import UpstreamClient
from chat.upstream.items import Delta

VARIANTS = ("httpx", "httpx-sharded", "aiohttp")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_client(variant: str, base_url: str, pool: int) -> UpstreamClient:
    if variant == "httpx":  # one client holding the whole pool, as before sharding
        client = UpstreamClient(base_url, read_timeout=60, total_timeout=600, backend="httpx")
        client._clients = [  # type: ignore[attr-defined]
            httpx.AsyncClient(
                base_url=client.http_client.base_url,
                timeout=client.http_client.timeout,
                limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
            )
        ]
        client._busy = [0]  # type: ignore[attr-defined]
        return client
    backend = {"httpx-sharded": "httpx", "aiohttp": "aiohttp"}.get(variant)
    if backend is None:
        raise SystemExit(f"unknown variant {variant}")
    return UpstreamClient(
        base_url, pool_size=pool, read_timeout=60, total_timeout=600, backend=backend
    )


async def run_variant(
    variant: str, base_url: str, n: int, seconds: float, tokens: int, pool: int
) -> dict[str, Any]:
    client = make_client(variant, base_url, pool)
    ttfts: list[float] = []
    total_tokens = 0
    answers = 0
    errors = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds

    async def one_user(index: int) -> None:
        nonlocal total_tokens, answers, errors
        await asyncio.sleep(index * (tokens / 50 + 0.1) / n)  # spread the first asks
        while loop.time() < stop_at:
            start = loop.time()
            first = True
            try:
                async for item in client.stream_chat(
                    model="demo-full", messages=[{"role": "user", "content": f"/long {tokens}"}]
                ):
                    if isinstance(item, Delta):
                        if first:
                            ttfts.append((loop.time() - start) * 1000)
                            first = False
                        total_tokens += 1
                answers += 1
            except Exception:
                errors += 1

    # Warm the pool so the variants are compared in steady state, not on connection set-up.
    await asyncio.gather(*(one_warm(client) for _ in range(min(n, 20))))
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    await asyncio.gather(*(one_user(i) for i in range(n)))
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    await client.aclose()
    return {
        "variant": variant,
        "n": n,
        "answers": answers,
        "errors": errors,
        "tokens": total_tokens,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 2),
        "cpu_ms_per_1k_tokens": round(cpu * 1000 / max(total_tokens, 1) * 1000, 1),
        "ttft_ms_p50": round(statistics.median(ttfts), 1) if ttfts else None,
        "ttft_ms_p99": round(_percentile(ttfts, 0.99), 1),
    }


async def one_warm(client: UpstreamClient) -> None:
    async for _ in client.stream_chat(
        model="demo-full", messages=[{"role": "user", "content": "hi"}]
    ):
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--pool", type=int, default=500)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")
    import django

    django.setup()
    from tests.demo_server import demo_process

    runner: Callable[[Any], Any] = asyncio.run
    if args.uvloop:
        import uvloop

        runner = uvloop.run
    rows = []
    with demo_process(100, 50) as (_, base_url):
        for n in args.n:
            for _ in range(args.repeat):  # interleaved, so drift hits every variant alike
                for variant in args.variants.split(","):
                    row = runner(
                        run_variant(variant, base_url, n, args.seconds, args.tokens, args.pool)
                    )
                    row["uvloop"] = args.uvloop
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
