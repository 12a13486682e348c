"""The benchmark runner behind `make bench` (--quick) and `make bench-full` (--full).

    .venv/bin/python -m bench.run --quick            # < 1 minute: proves the harness works
    .venv/bin/python -m bench.run --full             # ~20 minutes: the published numbers + peer
    .venv/bin/python -m bench.run --quick --peer --only relay   # the peer (LiteLLM) beside chatsite
    .venv/bin/python -m bench.run --quick --tiny --out /tmp/x --only relay   # the smoke test

Writes results.json (+ results.md, the tables) and PNG plots to the output folder:
bench/results/quick/ or bench/results/full/. A --full run into the default folder also copies
its plots to docs/benchmarks/, which docs/benchmarks.md shows. Every server it starts is
stopped before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import peer, procs, relay, turn_cpu
from bench.clients import DirectClient, ProxyClient, SocketClient
from bench.procs import ROOT, Proc, log
from bench.sizes import (
    DEMO_TPS,
    DEMO_TTFB_MS,
    FULL,
    PEER_SIDE,
    QUICK,
    QUICK_SKIPS,
    SECTIONS,
    SIDES,
    Config,
    tiny,
)
from bench.summary import difference, ratio


class Bench:
    """The servers of one run and the sections that use them."""

    def __init__(
        self,
        config: Config,
        sections: list[str],
        stack: contextlib.ExitStack,
        sides: list[str] | None = None,
        server_env: dict[str, str] | None = None,
        profile_to: Path | None = None,
        postgres: str = "",
    ) -> None:
        self.config = config
        self.profile_to = profile_to
        self.server_env = server_env or {}
        self.sections = sections
        self.sides = sides or list(SIDES)
        self.stack = stack
        self.workdir = Path(tempfile.mkdtemp(prefix="chatsite-bench-"))
        stack.callback(shutil.rmtree, self.workdir, True)
        self.redis = procs.redis_available()
        self.prefix = f"bench:{uuid.uuid4().hex[:10]}:"
        if self.redis:
            stack.callback(procs.delete_redis_prefix, self.prefix)
        self.postgres = postgres
        if postgres:
            self.template_db = procs.migrated_postgres(postgres, f"{self.prefix_id}_template")
            stack.callback(procs.drop_postgres, postgres, f"{self.prefix_id}_%")
        else:
            self.template_db = procs.migrated_database(self.workdir)

    @property
    def prefix_id(self) -> str:
        """This run's name for what it creates (databases), from its Redis prefix."""
        return "bench_" + self.prefix.split(":")[1]

    def database(self, name: str) -> str:
        """A copy of the migrated database for one server (SQLite, or PostgreSQL with
        --postgres: a database made from the migrated one as its template)."""
        if self.postgres:
            return procs.postgres_copy(self.postgres, self.template_db, f"{self.prefix_id}_{name}")
        source = Path(self.template_db.removeprefix("sqlite:///"))
        target = self.workdir / f"{name}.sqlite3"
        shutil.copy(source, target)
        return f"sqlite:///{target}"

    def site(
        self,
        name: str,
        upstream: Proc,
        *,
        redis: bool = False,
        users: int = 1,
        stack: contextlib.ExitStack | None = None,
    ) -> tuple[Proc, list[dict[str, str]]]:
        """chatsite on its own database with `users` logged-in users (one per socket)."""
        database = self.database(name)
        cookies = procs.make_users(database, users, f"bench-{name}-")
        site = (stack or self.stack).enter_context(
            procs.chatsite(
                database,
                upstream.base,
                redis_prefix=f"{self.prefix}{name}:" if redis else None,
                **self.server_env,
            )
        )
        site.name = name
        return site, cookies

    def site_group(
        self, name: str, upstream: Proc, *, count: int, users: int
    ) -> tuple[procs.ProcGroup, list[dict[str, str]]]:
        """`count` chatsite processes on one database and one Redis prefix: the scale-out
        topology on one machine (a load balancer's part is played by the clients, which take
        the processes in turn, so no proxy's CPU is counted)."""
        database = self.database(name)
        cookies = procs.make_users(database, users, f"bench-{name}-")
        group = procs.ProcGroup(name, [])
        for index in range(count):
            site = self.stack.enter_context(
                procs.chatsite(
                    database,
                    upstream.base,
                    redis_prefix=f"{self.prefix}{name}:",
                    CHAT_INSTANCE_ID=f"{name}_{index}",
                    **self.server_env,
                )
            )
            site.name = f"{name}-{index}"
            group.procs.append(site)
        return group, cookies

    async def run(self) -> dict[str, Any]:
        cfg = self.config
        results: dict[str, Any] = {"meta": meta(cfg, self.redis)}
        need_servers = {"relay", "turn_cpu", "capacity"} & set(self.sections)
        if need_servers:
            demo = self.stack.enter_context(procs.demo_model(DEMO_TTFB_MS, DEMO_TPS))
            users = max(
                [*cfg.relay_ns, *cfg.rate_concurrency, cfg.idle_sockets, cfg.turn_cpu_turns]
            )
            sites = {}
            if "chatsite" in self.sides:
                sites["chatsite"] = self.site("chatsite", demo, users=users)
            if self.redis and "chatsite_redis" in self.sides:
                sites["chatsite_redis"] = self.site("chatsite_redis", demo, redis=True, users=users)
            # "direct" is the reference every other side is compared with: always measured.
            sides: dict[str, tuple[Callable[[], relay.Client], Proc | None]] = {
                "direct": (lambda: DirectClient(demo.base), None)
            }
            for name, (site, cookies) in sites.items():
                sides[name] = (_socket_factory(site.base, cookies), site)
            if self.redis and "chatsite_x2" in self.sides:
                group, cookies = self.site_group("chatsite_x2", demo, count=2, users=users)
                sides["chatsite_x2"] = (_socket_factory(group.bases, cookies), group)  # type: ignore[dict-item]
            if "naive" in self.sides:
                naive = self.stack.enter_context(procs.naive_relay(demo.base))
                sides["naive"] = (_socket_factory(naive.base, [{}]), naive)
            if cfg.peer and PEER_SIDE in self.sides:
                results["peer"] = self.start_peer(demo, sides)
            if "relay" in self.sections:
                results["relay"] = await self.relay_cost(demo, sides)
            if "turn_cpu" in self.sections:
                results["turn_cpu"] = await self.turn_cpu(sites)
            if "capacity" in self.sections:
                results["capacity"] = await self.capacity(demo, sites, sides)
        if "reuse" in self.sections or "first_turn" in self.sections:
            stats_demo = self.stack.enter_context(
                procs.demo_model(DEMO_TTFB_MS, DEMO_TPS, stats=True)
            )
            if "reuse" in self.sections:
                results["reuse"] = await self.reuse(stats_demo)
            if "first_turn" in self.sections:
                results["first_turn"] = await self.first_turn(stats_demo)
        if "browser" in self.sections:
            from bench import browser

            results["browser"] = await browser.run(
                self, cfg.browser_tokens, cfg.browser_paced, cfg.browser_markdown
            )
        if "micro" in self.sections:
            results["micro"] = micro(cfg)
        return results

    def start_peer(
        self, demo: Proc, sides: dict[str, tuple[Callable[[], relay.Client], Proc | None]]
    ) -> dict[str, Any]:
        """Start the peer in front of the demo model and add it as a side, or say why not."""
        try:
            started = self.stack.enter_context(peer.start(demo.base, log))
        except peer.PeerUnavailable as exc:
            log(f"peer: {peer.NAME} skipped, the run goes on without it: {exc}")
            return {"name": peer.NAME, "skipped": str(exc)}
        base, key = started.proc.base, started.api_key
        sides[PEER_SIDE] = (lambda: ProxyClient(base, key), started.proc)
        log(f"peer: {peer.NAME} {started.version} on {base}")
        return started.describe()

    async def relay_cost(
        self, demo: Proc, sides: dict[str, tuple[Callable[[], relay.Client], Proc | None]]
    ) -> dict[str, Any]:
        cfg = self.config
        out: dict[str, Any] = {
            "tokens_per_answer": cfg.relay_tokens,
            "rounds": cfg.relay_rounds,
            "demo": {"ttfb_ms": DEMO_TTFB_MS, "tokens_per_second": DEMO_TPS},
            "by_n": {},
        }
        for n in cfg.relay_ns:
            by_side: dict[str, Any] = {}
            for name, (factory, server) in sides.items():
                log(f"relay cost: N={n} {name}")
                by_side[name] = await relay.relay_side(
                    factory,
                    n=n,
                    tokens=cfg.relay_tokens,
                    # At least relay_min_turns answers per side: p95 of three is one sample.
                    rounds=max(cfg.relay_rounds, -(-cfg.relay_min_turns // n)),
                    tps=DEMO_TPS,
                    answer_seconds=cfg.answer_seconds,
                    relay=server,
                    demo=demo,
                )
                await asyncio.sleep(0.5)  # let the last turns' bookkeeping finish
            direct = by_side["direct"]
            for name, side in by_side.items():
                if name == "direct":
                    continue
                side["added_ttft_ms"] = difference(side["ttft_ms"], direct["ttft_ms"])
                side["added_last_token_ms"] = difference(
                    side["last_token_ms"], direct["last_token_ms"]
                )
                side["added_token_delay_ms"] = difference(
                    side["token_delay_ms"], direct["token_delay_ms"]
                )
                side["completion_ratio"] = ratio(side["last_token_ms"], direct["last_token_ms"])
                side["done_ratio"] = ratio(side["done_ms"], direct["done_ms"])
            out["by_n"][str(n)] = by_side
        return out

    async def turn_cpu(self, sites: dict[str, tuple[Proc, list[dict[str, str]]]]) -> dict[str, Any]:
        """CPU per turn: bursts of turns, one per user, all asked at once (bench/turn_cpu.py)."""
        cfg = self.config
        out: dict[str, Any] = {}
        for name, (site, cookies) in sites.items():
            out[name] = await turn_cpu.turn_cpu_side(
                site,
                cookies,
                turns=cfg.turn_cpu_turns,
                tokens=cfg.turn_cpu_tokens,
                bursts=cfg.turn_cpu_bursts,
                answer_seconds=DEMO_TTFB_MS / 1000 + (cfg.turn_cpu_tokens - 1) / DEMO_TPS,
                profile_to=self.profile_to,
            )
            await asyncio.sleep(0.5)
        return out

    async def capacity(
        self,
        demo: Proc,
        sites: dict[str, tuple[Proc, list[dict[str, str]]]],
        sides: dict[str, tuple[Callable[[], relay.Client], Proc | None]],
    ) -> dict[str, Any]:
        cfg = self.config
        out: dict[str, Any] = {"idle": {}, "turn_rate": {}}
        for name, running in sites.items():
            if not cfg.mode.startswith("full"):
                # Quick: the running process (no restart). Its heap has room from the relay
                # runs, so its per-socket figure reads too low: only --full publishes it.
                log(f"capacity: {cfg.idle_sockets} idle sockets on {name}")
                out["idle"][name] = await relay.idle_sockets(*running, cfg.idle_sockets)
                continue
            # A fresh process: after the relay runs its heap has room that new sockets would
            # fill without growing RSS, and the per-socket figure would read too low.
            log(f"capacity: {cfg.idle_sockets} idle sockets on a fresh {name}")
            with contextlib.ExitStack() as fresh:
                site, cookies = self.site(
                    f"{name}_idle",
                    demo,
                    redis=name == "chatsite_redis",
                    users=cfg.idle_sockets,
                    stack=fresh,
                )
                out["idle"][name] = await relay.idle_sockets(site, cookies, cfg.idle_sockets)
        out["rate_answer_seconds"] = round(cfg.rate_answer_seconds, 3)
        for concurrency in cfg.rate_concurrency:
            by_side: dict[str, Any] = {}
            for name, (factory, server) in sides.items():
                log(f"capacity: turns/s with {concurrency} clients, {name}")
                by_side[name] = await relay.turn_rate(
                    factory,
                    concurrency=concurrency,
                    duration=cfg.rate_duration,
                    warmup=cfg.rate_warmup,
                    tokens=cfg.rate_tokens,
                    answer_seconds=cfg.rate_answer_seconds,
                    watched=[demo] if server is None else [demo, server],
                )
                await asyncio.sleep(0.5)
            out["turn_rate"][str(concurrency)] = by_side
        return out

    async def reuse(self, stats_demo: Proc) -> dict[str, Any]:
        cfg = self.config
        out: dict[str, Any] = {"pool_size": int(procs.server_setting("LLM_POOL_SIZE"))}
        site, cookies = self.site("reuse", stats_demo, users=cfg.reuse_concurrency)
        naive = self.stack.enter_context(procs.naive_relay(stats_demo.base))
        for name, factory in (
            ("chatsite", _socket_factory(site.base, cookies)),
            ("naive", _socket_factory(naive.base, [{}])),
        ):
            log(f"connection reuse: {cfg.reuse_turns} turns through {name}")
            out[name] = await relay.connection_reuse(
                stats_demo,
                factory,
                turns=cfg.reuse_turns,
                concurrency=cfg.reuse_concurrency,
                tokens=5,
            )
        return out

    async def first_turn(self, stats_demo: Proc) -> dict[str, Any]:
        cfg = self.config
        database = self.database("first")
        cookies = procs.make_users(database, 1, "bench-first-")[0]
        log(f"first turn: {cfg.first_trials} fresh processes cold and {cfg.first_trials} warmed")
        return await relay.first_turns(
            database, stats_demo, cookies, trials=cfg.first_trials, tokens=5
        )


def _socket_factory(
    base: str | list[str], cookies: list[dict[str, str]]
) -> Callable[[], relay.Client]:
    """A new socket client per call, each as the next user (round robin), on the next of
    `base` if it names several servers."""
    users = itertools.cycle(cookies)
    bases = itertools.cycle([base] if isinstance(base, str) else base)
    return lambda: SocketClient(next(bases), next(users))


def micro(cfg: Config) -> dict[str, Any]:
    """The limiter's and the tier policy's cost per call (their own scripts, unchanged)."""
    out: dict[str, Any] = {}
    for name, script in (("limiter", "limiter_cost.py"), ("tier", "tier_policy.py")):
        log(f"micro: bench/{script}")
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / script), *cfg.micro_args.get(name, [])],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "DJANGO_DEBUG": "1"},
        )
        out[name] = {"returncode": done.returncode, "markdown": done.stdout.strip()}
        if done.returncode:
            out[name]["stderr"] = done.stderr[-2000:]
    return out


def meta(cfg: Config, redis: bool) -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "uncommitted_changes": procs.working_tree_changes(),
        "config": asdict(cfg),
        "cores": os.cpu_count(),
        "cpu": cpu_model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis": redis,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small and fast (the default)")
    size.add_argument("--full", action="store_true", help="the published run (~15 min)")
    parser.add_argument("--tiny", action="store_true", help="smallest sizes (the smoke test)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--skip", default="", help="comma-separated sections to leave out")
    parser.add_argument("--sides", default="", help=f"comma-separated subset of {SIDES}")
    peer_choice = parser.add_mutually_exclusive_group()
    peer_choice.add_argument(
        "--peer",
        action="store_true",
        help=f"also measure {peer.NAME} (installed into bench/.peer-venv on first use)",
    )
    peer_choice.add_argument("--no-peer", action="store_true", help="leave the peer out")
    parser.add_argument("--relay-n", default="", help="comma-separated N for the relay cost")
    parser.add_argument("--rate-c", default="", help="comma-separated clients for turns/s")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the chatsite servers (to measure a setting)",
    )
    parser.add_argument(
        "--postgres",
        default="",
        metavar="URL",
        help="every chatsite server on its own PostgreSQL database, made and dropped through "
        "this server (e.g. postgres://postgres@127.0.0.1:5432/postgres), not SQLite",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample each chatsite server with py-spy during the turn-CPU bursts (py-spy must "
        "be installed next to this Python; not a project dependency) and write a text summary "
        "per server to DIR, beside py-spy's collapsed stacks (for a flame graph); "
        "BENCH_PROFILE_GIL=1 samples only the thread holding the GIL",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also copy the plots to docs/benchmarks/ (always with --full)",
    )
    args = parser.parse_args(argv)
    config = FULL if args.full else QUICK
    if args.tiny:
        config = tiny(config)
    if args.relay_n:
        config = replace(config, relay_ns=[int(n) for n in args.relay_n.split(",")])
    if args.rate_c:
        config = replace(config, rate_concurrency=[int(c) for c in args.rate_c.split(",")])
    sides = [s for s in args.sides.split(",") if s] or None
    if args.peer or args.no_peer or (sides and PEER_SIDE in sides):
        # The quick run never installs the peer unless asked: a first install takes minutes.
        config = replace(config, peer=not args.no_peer)
    # The quick run proves the harness works in well under a minute: it leaves out the two
    # micro-benchmarks (their own scripts) and the process restarts of first_turn (the smoke
    # test runs that section at its tiny size).
    default = SECTIONS if args.full else tuple(s for s in SECTIONS if s not in QUICK_SKIPS)
    sections = [s for s in (args.only.split(",") if args.only else default) if s]
    sections = [s for s in sections if s not in args.skip.split(",")]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    out = args.out or ROOT / "bench" / "results" / ("full" if args.full else "quick")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        server_env = dict(item.split("=", 1) for item in args.server_env)
        bench = Bench(
            config,
            sections,
            stack,
            sides,
            server_env,
            profile_to=args.profile,
            postgres=args.postgres,
        )
        results = asyncio.run(bench.run())
    results["meta"]["server_env"] = server_env
    results["meta"]["database"] = "postgresql" if args.postgres else "sqlite"
    if args.postgres:
        results["meta"]["postgres_databases"] = f"{bench.prefix_id}_%"  # dropped at the end
    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from bench import report

    (out / "results.md").write_text(report.markdown(results))
    if not args.no_plots:
        from bench import plots

        written = plots.write_all(results, out)
        if args.publish or (args.full and not args.out):
            target = ROOT / "docs" / "benchmarks"
            target.mkdir(parents=True, exist_ok=True)
            for path in written:
                shutil.copy(path, target / path.name)
    for line in report.headline(results):
        print(line)
    log(f"done in {results['meta']['duration_s']} s: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
