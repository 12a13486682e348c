"""The resume storm (docs/security.md): does one user's reconnect-and-resume churn slow another
user's first token?

A real daphne (SQLite, Redis for the limiter and the channel layer) and the demo model, each a
subprocess on fixed ports. Three attacking users each start one long markdown answer
(`/markdown N`) and, while it streams, keep `--sockets` sockets each reconnecting every
`--period` seconds and resuming that answer from its start (`after: -1`): every resume replays
every block so far. A fourth user (the victim) sends a short prompt every second on its own
socket and times its first chunk. Each run has a quiet phase (the attackers' answers stream,
nobody storms) and then the storm; the victim's first-token times of both are printed as JSON
(and appended to `--out` if given).

    .venv/bin/python -m bench.resume_storm --port 9402 --demo-port 9401

Nothing here asserts a time: the numbers go to docs/security.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench.clients import DESKTOP_UA
from bench.procs import (
    DAPHNE,
    REDIS_URL,
    ROOT,
    delete_redis_prefix,
    log,
    make_users,
    migrated_database,
    server_env,
    stop,
    wait_for_port,
)
from tests.demo_server import demo_process


@dataclass
class AttackStats:
    connects: int = 0
    resumes: int = 0
    refused: int = 0  # error frames with a mid (a refused resume)
    handshake_failures: int = 0
    bytes: int = 0
    refusal_sample: str = ""


@dataclass
class Victim:
    ttft_ms: list[float] = field(default_factory=list)
    at: list[float] = field(default_factory=list)  # when each was asked (monotonic)
    errors: list[str] = field(default_factory=list)


def ws_url(base: str, conversation: str = "") -> str:
    query = f"?conversation={conversation}" if conversation else ""
    return base.replace("http://", "ws://", 1) + "/ws/chat/" + query


def headers(base: str, session: str) -> dict[str, str]:
    return {"Origin": base, "User-Agent": DESKTOP_UA, "Cookie": f"sessionid={session}"}


async def open_ready(base: str, session: str, conversation: str = "") -> ClientConnection:
    ws = await connect(
        ws_url(base, conversation),
        additional_headers=headers(base, session),
        compression=None,
        max_size=None,
        open_timeout=30,
        ping_interval=None,
    )
    while True:
        frame = await ws.recv()
        if isinstance(frame, str) and frame.startswith('{"type": "ready"'):
            return ws
        if isinstance(frame, str) and frame.startswith('{"type": "error"'):
            await ws.close()
            raise RuntimeError(frame[:200])


async def start_answer(base: str, session: str, tokens: int) -> tuple[str, str]:
    """Ask for a long markdown answer; (conversation id, the answer's mid) once it streams."""
    ws = await open_ready(base, session)
    await ws.send(json.dumps({"type": "prompt", "conversation": "", "text": f"/markdown {tokens}"}))
    conversation = mid = ""
    async with asyncio.timeout(30):
        while not mid:
            frame = await ws.recv()
            if not isinstance(frame, str):
                continue
            if frame.startswith("{"):
                payload = json.loads(frame)
                if payload.get("type") == "chunk":
                    mid = payload["mid"]
                elif payload.get("type") == "error":
                    raise RuntimeError(frame[:300])
            elif 'name="conversation"' in frame and not conversation:
                conversation = frame.split('name="conversation"', 1)[1].split('value="', 1)[1]
                conversation = conversation.split('"', 1)[0]
    await ws.close()  # the answer goes on: turns outlive their tab
    return conversation, mid


async def attacker(
    base: str,
    session: str,
    conversation: str,
    mid: str,
    period: float,
    until: float,
    stats: AttackStats,
) -> None:
    """One tab: connect, resume the answer from its start, read for `period`, drop, again."""
    resume = json.dumps({"type": "resume", "mid": mid, "after": -1})
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            ws = await open_ready(base, session, conversation)
        except Exception:
            stats.handshake_failures += 1
            await asyncio.sleep(period)
            continue
        stats.connects += 1
        try:
            await ws.send(resume)
            stats.resumes += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.05, period - (time.monotonic() - began))):
                    async for frame in ws:
                        stats.bytes += len(frame)
                        if isinstance(frame, str) and frame.startswith('{"type": "error"'):
                            stats.refused += 1
                            stats.refusal_sample = stats.refusal_sample or frame[:300]
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                await ws.close()


async def victim(base: str, session: str, until: float, into: Victim) -> None:
    """Short prompts, one a second: the time from sending to the first chunk."""
    ws = await open_ready(base, session)
    while time.monotonic() < until:
        began = time.perf_counter()
        try:
            await ws.send(json.dumps({"type": "prompt", "conversation": "", "text": "/echo hi"}))
            first = None
            async with asyncio.timeout(30):
                while True:
                    frame = await ws.recv()
                    if not isinstance(frame, str) or not frame.startswith("{"):
                        continue
                    kind = json.loads(frame).get("type")
                    if kind == "chunk" and first is None:
                        first = (time.perf_counter() - began) * 1000
                    elif kind == "done":
                        break
                    elif kind == "error":
                        into.errors.append(frame[:200])
                        break
            if first is not None:
                into.ttft_ms.append(first)
                into.at.append(time.monotonic())
        except Exception as exc:
            into.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            with contextlib.suppress(Exception):
                await ws.close()
            ws = await open_ready(base, session)
        await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - began)))
    await ws.close()


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 1),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max": round(ordered[-1], 1),
    }


async def one_run(base: str, sessions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    attackers, victim_session = sessions[:-1], sessions[-1]
    answers = [await start_answer(base, s, args.tokens) for s in attackers]
    log(f"answers streaming: {[mid for _, mid in answers]}; letting them grow {args.grow:g} s")
    await asyncio.sleep(args.grow)
    quiet = Victim()
    await victim(base, victim_session, time.monotonic() + args.quiet, quiet)
    log(f"quiet: {summary(quiet.ttft_ms)}; storm for {args.storm:g} s")
    # The attacking tabs run in a process of their own: in this one they would hold up the
    # victim's own event loop (reading their replays), and the victim's times would be ours.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        attack = asyncio.get_running_loop().run_in_executor(
            pool, run_attack, base, attackers, answers, args.sockets, args.period, args.storm
        )
        # The victim starts once the storm has built up (`--settle`: past a rate's first
        # window, it meets the limit's steady state), and stops with it.
        began = time.monotonic()
        await asyncio.sleep(args.settle)
        storm = Victim()
        await victim(base, victim_session, time.monotonic() + args.storm - args.settle - 1, storm)
        stats = await attack
    result = {
        "quiet_ttft_ms": summary(quiet.ttft_ms),
        "storm_ttft_ms": summary(storm.ttft_ms),
        # The first minute of the storm (a per-minute rate still has room), and after it.
        "storm_first_minute_ttft_ms": summary(
            [ms for ms, at in zip(storm.ttft_ms, storm.at, strict=True) if at - began < 60]
        ),
        "storm_later_ttft_ms": summary(
            [ms for ms, at in zip(storm.ttft_ms, storm.at, strict=True) if at - began >= 60]
        ),
        "victim_errors": quiet.errors + storm.errors,
        "attack": stats.__dict__,
    }
    log(
        f"storm: {result['storm_first_minute_ttft_ms']} then {result['storm_later_ttft_ms']}; "
        f"attack: {stats.connects} connects, "
        f"{stats.resumes} resumes, {stats.refused} refused, {stats.bytes / 1e6:.0f} MB"
    )
    return result


def run_attack(
    base: str,
    sessions: list[str],
    answers: list[tuple[str, str]],
    sockets: int,
    period: float,
    seconds: float,
) -> AttackStats:
    """`sockets` tabs per attacking user, each resuming its user's answer every `period`."""
    stats = AttackStats()

    async def storm() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(
                attacker(base, session, conversation, mid, period, until, stats)
                for session, (conversation, mid) in zip(sessions, answers, strict=True)
                for _ in range(sockets)
            )
        )

    asyncio.run(storm())
    return stats


@contextlib.contextmanager
def daphne(port: int, env: dict[str, str]) -> Iterator[str]:
    workdir = Path(tempfile.mkdtemp(prefix="resume-storm-"))
    log_path = workdir / "server.log"
    with log_path.open("wb") as out:
        popen = subprocess.Popen(
            [DAPHNE, "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(port, popen, log_path)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(popen)


def git_head() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9402)
    parser.add_argument("--demo-port", type=int, default=9401)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--tps", type=float, default=2500)
    parser.add_argument("--sockets", type=int, default=20, help="per attacking user")
    parser.add_argument("--users", type=int, default=3, help="attacking users")
    parser.add_argument("--period", type=float, default=2.0)
    parser.add_argument("--grow", type=float, default=20.0)
    parser.add_argument("--quiet", type=float, default=10.0)
    parser.add_argument("--storm", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=5.0, help="storm before timing")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--env", action="append", default=[], help="NAME=value for chatsite")
    args = parser.parse_args()
    prefix = f"rs-bench-{uuid.uuid4().hex[:8]}:"
    extra = dict(item.split("=", 1) for item in args.env)
    with (
        tempfile.TemporaryDirectory(prefix="resume-storm-db-") as tmp,
        demo_process(0, args.tps, port=args.demo_port) as (_demo, demo_base),
    ):
        database = migrated_database(Path(tmp))
        sessions = [c["sessionid"] for c in make_users(database, args.users + 1, "storm")]
        env = server_env(
            DATABASE_URL=database,
            LLM_BASE_URL=demo_base,
            PORT=str(args.port),
            REDIS_URL=REDIS_URL,
            CHAT_REDIS_PREFIX=prefix,
            DATABASE_CONN_MAX_AGE="60",
            **extra,
        )
        # The limits the attackers meet are the defaults (sockets per user: 30, the rates of
        # resumes and handshakes), unless --env sets them; the victim's prompts are lifted by
        # server_env (they measure time, not the rate limit).
        for name in ("CHAT_MAX_SOCKETS_PER_USER", "CHAT_SOCKET_RATE"):
            if name not in extra:
                env.pop(name, None)
        try:
            with daphne(args.port, env) as base:
                result = asyncio.run(one_run(base, sessions, args))
        finally:
            delete_redis_prefix(prefix)
    result.update(
        label=args.label,
        commit=git_head(),
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        params={k: v for k, v in vars(args).items() if k not in ("out",)},
    )
    text = json.dumps(result, default=str)
    print(text)
    if args.out:
        with args.out.open("a") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
