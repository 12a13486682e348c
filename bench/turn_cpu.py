"""CPU per turn: a burst of N turns, one per user, all asked at once; server CPU / turns.

Each of N sockets (N users, opened before the window) asks one new-conversation prompt for a
`tokens`-token answer at the same moment; the window runs from the first ask until every
`done` has arrived and the server has gone quiet. The server's CPU over the window (user +
system, all threads, from /proc/<pid>/stat), divided by the turns, is everything a turn costs:
the admission, the session check, the exchange's rows, the bubbles' HTML, the relay of its
tokens, the final save and render, usage and the stream log. The sockets' handshakes are not in
it. CPU time is far less sensitive than latency to other work on a shared machine; the burst is
repeated (after an unmeasured warm-up burst) and the median reported.

`profile_to` (a folder) records the server with py-spy during the bursts, when py-spy is
installed next to this Python (it is not a project dependency): see `bench/profile_summary.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.clients import SocketClient, TurnRecord, answer_offsets, close_all, long_prompt, open_all
from bench.procs import Proc, log
from bench.relay import Meter
from bench.summary import dist

# After the last `done` the turns still close their stream log and report metrics; the
# window waits this long for the process to go quiet (idle daphne uses ~0 CPU).
SETTLE_SECONDS = 0.3


async def burst(
    site: Proc,
    cookies: list[dict[str, str]],
    *,
    turns: int,
    tokens: int,
    timeout: float,
) -> dict[str, Any]:
    """One burst: `turns` users ask at once; the server's CPU per turn."""
    clients = [SocketClient(site.base, cookies[i % len(cookies)]) for i in range(turns)]
    open_failures = await open_all(clients)
    await asyncio.sleep(0.3)  # the handshakes' own work is done before the window
    prompt, offsets = long_prompt(tokens), answer_offsets(tokens)
    started = time.perf_counter()
    with Meter([site]) as meter:
        records: list[TurnRecord] = await asyncio.gather(
            *(c.turn(prompt, tokens, timeout, offsets) for c in clients)
        )
        wall = time.perf_counter() - started
        await asyncio.sleep(SETTLE_SECONDS)
    await close_all(clients)
    ok = [r for r in records if r.ok]
    cpu_ms = meter.cpu[site.name] * 1000
    return {
        "turns": len(records),
        "ok": len(ok),
        "open_failures": len(open_failures),
        "errors": sorted({r.error for r in records if r.error})[:3],
        "wall_s": round(wall, 3),
        "server_cpu_ms": round(cpu_ms, 1),
        "cpu_ms_per_turn": round(cpu_ms / max(len(ok), 1), 2),
        # The same CPU per relayed token: the relay's cost at `turns` streams at once.
        "cpu_ms_per_1k_tokens": round(cpu_ms * 1000 / max(len(ok) * tokens, 1), 1),
        "ttft_ms": dist((r.ttft for r in ok if r.ttft is not None), 1000),
        "done_ms": dist((r.done for r in ok if r.done is not None), 1000),
        "usage": meter.report(),
    }


async def turn_cpu_side(
    site: Proc,
    cookies: list[dict[str, str]],
    *,
    turns: int,
    tokens: int,
    bursts: int,
    answer_seconds: float,
    profile_to: Path | None = None,
) -> dict[str, Any]:
    """`bursts` bursts on one server; the median CPU per turn and every burst's figures."""
    # First-use work (imports, templates, scripts loaded into Redis) is not a turn's cost.
    await burst(
        site, cookies, turns=min(turns, 10), tokens=tokens, timeout=answer_seconds * 30 + 60
    )
    runs = []
    with _profiled(site, profile_to):
        for index in range(bursts):
            log(f"turn cpu: {site.name} burst {index + 1}/{bursts} of {turns} turns")
            runs.append(
                await burst(
                    site, cookies, turns=turns, tokens=tokens, timeout=answer_seconds * 30 + 60
                )
            )
            await asyncio.sleep(0.5)
    per_turn = [r["cpu_ms_per_turn"] for r in runs]
    per_1k = [r["cpu_ms_per_1k_tokens"] for r in runs]
    return {
        "turns": turns,
        "tokens": tokens,
        "bursts": runs,
        "cpu_ms_per_turn": per_turn,
        "median_cpu_ms_per_turn": round(statistics.median(per_turn), 2),
        "cpu_ms_per_1k_tokens": per_1k,
        "median_cpu_ms_per_1k_tokens": round(statistics.median(per_1k), 1),
        "load_average": _load_average(),
    }


def _load_average() -> list[float]:
    with contextlib.suppress(OSError):
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    return []


def py_spy() -> str | None:
    """py-spy next to this Python or on PATH (a developer's tool, not a dependency)."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def _profiled(site: Proc, out: Path | None) -> Iterator[None]:
    """Sample `site` with py-spy (collapsed stacks) while the block runs; summarise after."""
    if out is None:
        yield
        return
    spy = py_spy()
    if spy is None:
        log("turn cpu: no py-spy next to this Python: no profile (pip install py-spy)")
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"{site.name}.collapsed.tmp"
    command = [spy, "record", "--pid", str(site.pid), "--format", "raw", "--threads"]
    command += ["--rate", "200", "--nonblocking", "--output", str(raw)]
    if os.environ.get("BENCH_PROFILE_GIL"):
        # Only the thread holding the GIL: Python's own work, without the waits for the GIL
        # (which the default view counts where they happen) nor C code that released it.
        command.append("--gil")
    popen = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        popen.send_signal(signal.SIGINT)
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
        if raw.exists():
            from bench.profile_summary import summarise

            text = summarise(raw.read_text())
            (out / f"{site.name}.profile.txt").write_text(text)
            # The stacks stay beside the summary, for a flame graph (flamegraph.pl, speedscope).
            raw.rename(out / f"{site.name}.collapsed")
            log(f"turn cpu: profile of {site.name} in {out / (site.name + '.profile.txt')}")
        else:
            log(f"turn cpu: py-spy wrote nothing: {popen.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
