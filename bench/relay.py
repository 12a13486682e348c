"""Server-side benchmarks: relay cost, capacity, upstream connection reuse, cold first turn.

Each function drives servers that bench/procs.py started and returns a JSON-ready dict. The
load comes from bench/clients.py in this process; CPU is read from /proc for every process
around the measured window, so "server CPU per 1,000 tokens" is the relay's own work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httpx

from bench import procs
from bench.clients import SocketClient, TurnRecord, answer_offsets, close_all, long_prompt, open_all
from bench.procs import Proc
from bench.summary import dist, turns_summary


class Client(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def turn(
        self, prompt: str, tokens: int, timeout: float, offsets: list[int] | None = None
    ) -> TurnRecord: ...


class Meter:
    """CPU of each watched process, of this client process and of the machine over a window."""

    def __init__(self, watched: Sequence[Proc]) -> None:
        self.watched = list(watched)

    def __enter__(self) -> Meter:
        self.cpu0 = {p.name: p.cpu_seconds() for p in self.watched}
        self.own0 = procs.own_cpu_seconds()
        self.machine0 = procs.machine_cpu()
        self.wall0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = {p.name: p.cpu_seconds() - self.cpu0[p.name] for p in self.watched}
        self.own = procs.own_cpu_seconds() - self.own0
        busy1, total1 = procs.machine_cpu()
        busy0, total0 = self.machine0
        self.machine_busy = (busy1 - busy0) / max(total1 - total0, 1e-9)
        # CPU the machine spent on anything but the servers and this client: other work on
        # a shared box shows up here, and a large value makes the window's numbers suspect.
        self.other = (busy1 - busy0) - sum(self.cpu.values()) - self.own
        # Resident memory at the end of the window and the process's high-water mark so far
        # (the runs go up in N, so that is the peak of the largest load yet).
        self.rss = {p.name: p.rss_bytes() for p in self.watched}
        self.rss_peak = {p.name: p.rss_peak_bytes() for p in self.watched}

    def report(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall, 3),
            "cpu_ms": {name: round(s * 1000, 1) for name, s in self.cpu.items()},
            "client_cpu_ms": round(self.own * 1000, 1),
            # Of the machine's 2 cores: 100 % means both were busy the whole window.
            "machine_busy_pct": round(self.machine_busy * 100, 1),
            "other_cpu_ms": round(self.other * 1000, 1),
            "rss_mib": {name: round(b / 2**20, 1) for name, b in self.rss.items()},
            "rss_peak_mib": {name: round(b / 2**20, 1) for name, b in self.rss_peak.items()},
        }


async def run_turns(
    clients: Sequence[Client],
    tokens: int,
    *,
    rounds: int,
    stagger: float,
    timeout: float,
) -> list[TurnRecord]:
    """Each client asks `rounds` times back to back; first asks spread over `stagger` seconds.

    Spreading the first asks over one answer's duration makes the load steady: about
    len(clients) answers are streaming at any moment, and new turns start all the time.
    """
    prompt, offsets = long_prompt(tokens), answer_offsets(tokens)
    records: list[TurnRecord] = []

    async def worker(index: int, client: Client) -> None:
        await asyncio.sleep(stagger * index / len(clients))
        for _ in range(rounds):
            records.append(await client.turn(prompt, tokens, timeout, offsets))

    await asyncio.gather(*(worker(i, c) for i, c in enumerate(clients)))
    return records


async def relay_side(
    make_client: Callable[[], Client],
    *,
    n: int,
    tokens: int,
    rounds: int,
    tps: float,
    answer_seconds: float,
    relay: Proc | None,
    demo: Proc,
) -> dict[str, Any]:
    """N concurrent answers on one side (direct, chatsite, chatsite + Redis, naive relay, peer)."""
    clients = [make_client() for _ in range(n)]
    open_failures = await open_all(clients)
    watched = [demo] if relay is None else [demo, relay]
    with Meter(watched) as meter:
        records = await run_turns(
            clients,
            tokens,
            rounds=rounds,
            stagger=answer_seconds,
            timeout=answer_seconds * 20 + 60,
        )
    await close_all(clients)
    result = turns_summary(records, tps)
    result["open_failures"] = len(open_failures)
    result["usage"] = meter.report()
    relayed = max(result["tokens"], 1)
    result["demo_cpu_ms_per_1k_tokens"] = round(meter.cpu["demo"] * 1e6 / relayed, 1)
    result["client_cpu_ms_per_1k_tokens"] = round(meter.own * 1e6 / relayed, 1)
    if relay is not None:
        result["server_cpu_ms_per_1k_tokens"] = round(meter.cpu[relay.name] * 1e6 / relayed, 1)
        result["server_rss_mib"] = round(meter.rss[relay.name] / 2**20, 1)
        result["server_rss_peak_mib"] = round(meter.rss_peak[relay.name] / 2**20, 1)
    return result


async def idle_sockets(site: Proc, cookies: list[dict[str, str]], count: int) -> dict[str, Any]:
    """Memory per idle socket: RSS of the daphne process before and after `count` sockets."""
    warm = SocketClient(site.base, cookies[0])
    await warm.open()  # first-use costs (imports, caches) are not per socket
    await warm.close()
    await asyncio.sleep(0.3)
    rss_before = site.rss_bytes()
    clients = [SocketClient(site.base, cookies[i % len(cookies)]) for i in range(count)]
    started = time.perf_counter()
    failures = await open_all(clients, concurrency=50)
    open_seconds = time.perf_counter() - started
    await asyncio.sleep(0.5)
    rss_open = site.rss_bytes()
    held = count - len(failures)
    await close_all(clients)
    await asyncio.sleep(0.5)
    rss_after = site.rss_bytes()
    return {
        "sockets": count,
        "held": held,
        "failures": len(failures),
        "failure_examples": failures[:3],
        "rss_before_mib": round(rss_before / 2**20, 1),
        "rss_open_mib": round(rss_open / 2**20, 1),
        "rss_after_close_mib": round(rss_after / 2**20, 1),
        "kib_per_socket": round((rss_open - rss_before) / max(held, 1) / 1024, 1),
        "handshakes_per_s": round(held / open_seconds, 1),
    }


async def turn_rate(
    make_client: Callable[[], Client],
    *,
    concurrency: int,
    duration: float,
    warmup: float,
    tokens: int,
    answer_seconds: float,
    watched: Sequence[Proc],
) -> dict[str, Any]:
    """Complete turns per second, closed loop: each client asks again as soon as it is answered.

    Turns are counted when they end inside the measured window (after `warmup`), so the
    ramp-up and the tail do not dilute the rate.
    """
    clients = [make_client() for _ in range(concurrency)]
    open_failures = await open_all(clients)
    prompt, offsets = long_prompt(tokens), answer_offsets(tokens)
    records: list[TurnRecord] = []
    t0 = time.perf_counter()
    window_start, window_end = t0 + warmup, t0 + warmup + duration
    meter = Meter(watched)

    async def worker(index: int, client: Client) -> None:
        await asyncio.sleep(answer_seconds * index / concurrency)
        while time.perf_counter() < window_end:
            records.append(await client.turn(prompt, tokens, answer_seconds * 20 + 30, offsets))

    async def meter_window() -> None:
        await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
        meter.__enter__()
        await asyncio.sleep(max(0.0, window_end - time.perf_counter()))
        meter.__exit__()

    await asyncio.gather(meter_window(), *(worker(i, c) for i, c in enumerate(clients)))
    await close_all(clients)
    in_window = [
        r
        for r in records
        if r.done is not None and window_start <= r.started_at + r.done <= window_end
    ]
    ok = [r for r in in_window if r.ok]
    summary = turns_summary(in_window, 0)
    return {
        "concurrency": concurrency,
        "window_s": duration,
        "turns_per_s": round(len(ok) / duration, 1),
        "failed_in_window": len(in_window) - len(ok),
        "open_failures": len(open_failures),
        "ttft_ms": summary["ttft_ms"],
        "done_ms": summary["done_ms"],
        "errors": summary["errors"],
        "usage": meter.report(),
        # The ceiling a perfect relay would reach: every client always waiting on the model.
        "ideal_turns_per_s": round(concurrency / answer_seconds, 1),
    }


async def connection_reuse(
    stats_demo: Proc,
    make_client: Callable[[], Client],
    *,
    turns: int,
    concurrency: int,
    tokens: int,
) -> dict[str, Any]:
    """TCP connections the model server accepted while a relay ran `turns` turns."""
    seen_before = procs.demo_requests(stats_demo)
    ports_before = {port for _, port in seen_before}
    clients = [make_client() for _ in range(concurrency)]
    await open_all(clients)
    per_client = max(1, turns // concurrency)
    records = await run_turns(clients, tokens, rounds=per_client, stagger=0.2, timeout=120)
    await close_all(clients)
    window = procs.demo_requests(stats_demo)[len(seen_before) :]
    completions = [port for path, port in window if path.endswith("/chat/completions")]
    used = set(completions)
    return {
        "turns": len(records),
        "turns_ok": sum(r.ok for r in records),
        "concurrency": concurrency,
        "completion_requests": len(completions),
        "connections_used": len(used),
        "connections_opened": len(used - ports_before),
        "warmed_before": len(ports_before & used),
    }


async def first_turns(
    database_url: str,
    stats_demo: Proc,
    cookies: dict[str, str],
    *,
    trials: int,
    tokens: int,
) -> dict[str, Any]:
    """The first turn of a fresh process, with and without a page view before it.

    daphne has no start-up hook, so chatsite warms its upstream pool on its first HTTP
    request (or socket). "cold": the socket is the process's first contact and the prompt
    follows at once. "warmed": a page view first, and the prompt once the model server saw
    the warm-up request. The second turn on the same socket is the steady state.
    """
    results: dict[str, list[TurnRecord]] = {"cold": [], "warmed": [], "second": []}
    loop = asyncio.get_running_loop()
    for _ in range(trials):
        for variant in ("cold", "warmed"):
            # Starting a server blocks for a second or two; nothing else is running meanwhile.
            with procs.chatsite(database_url, stats_demo.base) as site:
                if variant == "warmed":
                    seen = len(procs.demo_requests(stats_demo))
                    await loop.run_in_executor(None, _page_view, site.base)
                    deadline = time.monotonic() + 10
                    while len(procs.demo_requests(stats_demo)) == seen:
                        if time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.02)
                client = SocketClient(site.base, cookies)
                await client.open()
                offsets = answer_offsets(tokens)
                results[variant].append(await client.turn(long_prompt(tokens), tokens, 60, offsets))
                results["second"].append(
                    await client.turn(long_prompt(tokens), tokens, 60, offsets)
                )
                await client.close()
    return {
        name: {
            "ttft_ms": dist((r.ttft for r in recs if r.ttft is not None), 1000),
            "done_ms": dist((r.done for r in recs if r.done is not None), 1000),
            "failed": sum(not r.ok for r in recs),
        }
        for name, recs in results.items()
    }


def _page_view(base: str) -> None:
    httpx.get(base + "/accounts/login/", timeout=30, trust_env=False)
