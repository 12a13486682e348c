"""Markdown tables of a benchmark run (results.json → results.md), quoted by docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

DASH = "\u2013"  # an en dash: "not applicable" in a table cell
SIDE_NAMES = {
    "direct": "direct from the model",
    "chatsite": "chatsite",
    "chatsite_redis": "chatsite + Redis",
    "chatsite_x2": "chatsite, 2 processes + Redis",
    "naive": "naive relay",
    "litellm": "LiteLLM proxy",
}
# The peer table sets the peer beside these sides of the same run.
PEER_BESIDE = ("chatsite", "chatsite_redis", "litellm")


def _p(d: dict[str, Any] | None, digits: int = 1) -> str:
    if not d or not d.get("n", 1):
        return DASH
    return " / ".join(f"{d[q]:.{digits}f}" for q in ("p50", "p95", "p99") if q in d)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def relay_tables(relay: dict[str, Any]) -> str:
    out = [
        f"Answers of {relay['tokens_per_answer']} tokens at {relay['demo']['tokens_per_second']:g}"
        f" tokens/s after {relay['demo']['ttfb_ms']} ms; {relay['rounds']} per client. "
        "Times in ms as p50 / p95 / p99.\n"
    ]
    rows = []
    for n, sides in relay["by_n"].items():
        for name, s in sides.items():
            rows.append(
                [
                    n,
                    SIDE_NAMES.get(name, name),
                    f"{s['ok']}/{s['turns']}",
                    _p(s["ttft_ms"]),
                    _p(s.get("added_ttft_ms")) if name != "direct" else DASH,
                    _p(s["last_token_ms"], 0),
                    _p(s.get("completion_ratio"), 3) if name != "direct" else DASH,
                    _p(s["token_delay_ms"]),
                    _p(s["frames_per_answer"], 0),
                    s.get("server_cpu_ms_per_1k_tokens", DASH),
                    s["demo_cpu_ms_per_1k_tokens"],
                    s["client_cpu_ms_per_1k_tokens"],
                    s.get("server_rss_peak_mib", DASH),
                    s["usage"]["machine_busy_pct"],
                ]
            )
    out.append(
        _table(
            [
                "N",
                "path",
                "ok",
                "TTFT",
                "added TTFT",
                "last token",
                "completion ratio",
                "token delay",
                "frames/answer",
                "server CPU ms/1k tok",
                "model CPU ms/1k tok",
                "client CPU ms/1k tok",
                "server RSS peak MiB",
                "machine busy %",
            ],
            rows,
        )
    )
    return "\n".join(out)


def _q(d: dict[str, Any] | None, q: str, digits: int = 1) -> str:
    return f"{d[q]:.{digits}f}" if d and q in d else DASH


def peer_table(relay: dict[str, Any], peer: dict[str, Any]) -> str:
    """chatsite beside the peer at every N of the relay runs: what each adds to the model."""
    if peer.get("skipped"):
        return f"{peer['name']} skipped: {peer['skipped']}\n"
    rows = []
    for n, sides in relay["by_n"].items():
        direct_done = sides["direct"]["done_ms"]
        for name in PEER_BESIDE:
            s = sides.get(name)
            if s is None:
                continue
            # When the client sees the end of the stream ([DONE], or chatsite's `done`).
            added_done = (
                f"{s['done_ms']['p50'] - direct_done['p50']:.1f}"
                if "p50" in s["done_ms"] and "p50" in direct_done
                else DASH
            )
            rows.append(
                [
                    n,
                    SIDE_NAMES[name],
                    f"{s['ok']}/{s['turns']}",
                    _q(s.get("added_ttft_ms"), "p50"),
                    _q(s.get("added_ttft_ms"), "p99"),
                    _q(s["token_delay_ms"], "p50"),
                    _q(s["token_delay_ms"], "p99"),
                    added_done,
                    s.get("server_cpu_ms_per_1k_tokens", DASH),
                    s.get("server_rss_peak_mib", DASH),
                ]
            )
    return f"{peer['name']} {peer['version']} ({peer['requirement']}), one process.\n\n" + _table(
        [
            "N",
            "path",
            "ok",
            "added TTFT p50 ms",
            "added TTFT p99 ms",
            "token delay p50 ms",
            "token delay p99 ms",
            "added end p50 ms",
            "CPU ms/1k tok",
            "RSS peak MiB",
        ],
        rows,
    )


def capacity_tables(cap: dict[str, Any]) -> str:
    out = []
    rows = [
        [
            SIDE_NAMES.get(name, name),
            f"{r['held']}/{r['sockets']}",
            r["rss_before_mib"],
            r["rss_open_mib"],
            r["kib_per_socket"],
            r["rss_after_close_mib"],
            r["handshakes_per_s"],
        ]
        for name, r in cap.get("idle", {}).items()
    ]
    out.append(
        _table(
            [
                "server",
                "sockets held",
                "RSS before MiB",
                "RSS open MiB",
                "KiB / socket",
                "RSS after close MiB",
                "handshakes/s",
            ],
            rows,
        )
    )
    rows = []
    for concurrency, sides in cap.get("turn_rate", {}).items():
        for name, r in sides.items():
            rows.append(
                [
                    concurrency,
                    SIDE_NAMES.get(name, name),
                    r["turns_per_s"],
                    r["ideal_turns_per_s"],
                    r["failed_in_window"] + r["open_failures"],
                    _p(r["ttft_ms"]),
                    _p(r["done_ms"], 0),
                    r["usage"]["cpu_ms"].get(name, DASH) if name != "direct" else DASH,
                    r["usage"]["machine_busy_pct"],
                ]
            )
    out.append(
        f"Closed loop, answers of {cap.get('rate_answer_seconds')} s from the model.\n\n"
        + _table(
            [
                "clients",
                "path",
                "turns/s",
                "ideal turns/s",
                "failed",
                "TTFT ms",
                "turn ms",
                "server CPU ms in window",
                "machine busy %",
            ],
            rows,
        )
    )
    return "\n".join(out)


def reuse_table(reuse: dict[str, Any]) -> str:
    rows = [
        [
            SIDE_NAMES.get(name, name),
            f"{r['turns_ok']}/{r['turns']}",
            r["concurrency"],
            r["completion_requests"],
            r["connections_used"],
            r["connections_opened"],
        ]
        for name, r in reuse.items()
        if isinstance(r, dict)
    ]
    return f"Pool size (LLM_POOL_SIZE): {reuse.get('pool_size')}\n\n" + _table(
        ["relay", "turns ok", "clients", "requests", "connections used", "opened during"], rows
    )


def first_turn_table(first: dict[str, Any]) -> str:
    rows = [
        [name, r["ttft_ms"].get("n", 0), _p(r["ttft_ms"]), _p(r["done_ms"]), r["failed"]]
        for name, r in first.items()
    ]
    return _table(["turn", "n", "TTFT ms", "turn ms", "failed"], rows)


def browser_table(browser: dict[str, Any]) -> str:
    if browser.get("skipped"):
        return f"Skipped: {browser['skipped']}\n"
    rows = []
    for run in browser.get("runs", []):
        rows.append(
            [
                run["renderer"],
                run["tokens"],
                f"{run['tokens_per_second']:g}" if run.get("tokens_per_second") else "max",
                "yes" if run.get("complete") else "no",
                run.get("chunk_frames", DASH),
                run.get("long_tasks", DASH),
                run.get("longest_task_ms", DASH),
                run.get("total_blocking_ms", DASH),
                run.get("heap_peak_mib", DASH),
                _p(run.get("chunk_to_paint_ms")),
                run.get("stream_ms", DASH),
            ]
        )
    return _table(
        [
            "renderer",
            "tokens",
            "tokens/s",
            "complete",
            "chunk frames",
            "long tasks",
            "longest ms",
            "TBT ms",
            "JS heap peak MiB",
            "chunk→paint ms",
            "stream ms",
        ],
        rows,
    )


def turn_cpu_table(turn_cpu: dict[str, Any]) -> str:
    rows = []
    for name, side in turn_cpu.items():
        for index, run in enumerate(side["bursts"], 1):
            rows.append(
                [
                    name,
                    index,
                    f"{run['ok']}/{run['turns']}",
                    side["tokens"],
                    run["server_cpu_ms"],
                    f"**{run['cpu_ms_per_turn']}**",
                    run["cpu_ms_per_1k_tokens"],
                    _p(run["ttft_ms"]),
                    run["wall_s"],
                    f"{run['usage']['machine_busy_pct']} %",
                ]
            )
    return _table(
        [
            "server",
            "burst",
            "ok",
            "tokens / answer",
            "server CPU ms",
            "CPU ms / turn",
            "CPU ms / 1k tokens",
            "TTFT ms",
            "wall s",
            "machine busy",
        ],
        rows,
    )


def headline(results: dict[str, Any]) -> list[str]:
    """The two CPU figures issue 18 targets, one line each, for the terminal."""
    lines = []
    for name, side in results.get("turn_cpu", {}).items():
        each = ", ".join(f"{v:g}" for v in side["cpu_ms_per_turn"])
        lines.append(
            f"CPU per turn, {name}: {side['median_cpu_ms_per_turn']:g} ms median ({each}) over "
            f"bursts of {side['turns']} turns of {side['tokens']} tokens; load average "
            f"{' '.join(f'{v:g}' for v in side['load_average'])}"
        )
        lines.append(
            f"relay CPU per 1,000 tokens, {name}, {side['turns']} streams at once: "
            f"{side['median_cpu_ms_per_1k_tokens']:g} ms median "
            f"({', '.join(f'{v:g}' for v in side['cpu_ms_per_1k_tokens'])})"
        )
    by_n = results.get("relay", {}).get("by_n", {})
    if by_n:
        n = max(by_n, key=int)
        for name, side in by_n[n].items():
            if "server_cpu_ms_per_1k_tokens" in side:
                lines.append(
                    f"relay CPU per 1,000 tokens, {name}, N = {n} (relay section, "
                    f"{results['relay']['tokens_per_answer']}-token answers): "
                    f"{side['server_cpu_ms_per_1k_tokens']:g} ms"
                )
    return lines


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    parts = [
        f"# Benchmark run ({meta['config']['mode']})\n",
        f"{meta['date']}, commit {meta['commit']}, {meta['cores']} cores ({meta['cpu']}), "
        f"{meta['memory_gib']} GiB, Python {meta['python']}, Redis: {meta['redis']}, "
        f"took {meta.get('duration_s', '?')} s.\n",
    ]
    if "relay" in results:
        parts += ["## Relay cost\n", relay_tables(results["relay"])]
    if "peer" in results and "relay" in results:
        parts += ["## Beside the peer\n", peer_table(results["relay"], results["peer"])]
    if "turn_cpu" in results:
        parts += [
            "## CPU per turn (bursts, one turn per user)\n",
            turn_cpu_table(results["turn_cpu"]),
        ]
    if "capacity" in results:
        parts += ["## Capacity\n", capacity_tables(results["capacity"])]
    if "reuse" in results:
        parts += ["## Upstream connection reuse\n", reuse_table(results["reuse"])]
    if "first_turn" in results:
        parts += ["## First turn of a fresh process\n", first_turn_table(results["first_turn"])]
    if "browser" in results:
        parts += ["## Browser\n", browser_table(results["browser"])]
    for name, micro in results.get("micro", {}).items():
        parts += [f"## {name} (its own script)\n", micro["markdown"] + "\n"]
    return "\n".join(parts)
