"""A/B of the chat page's rendering in headless Chromium: variants of static/ on one server.

    .venv/bin/python -m bench.browser_ab --rounds 5 --variant cv=/tmp/cv-static
    .venv/bin/python -m bench.browser_ab --rounds 1 --trace /tmp/traces   # + where the time went

Each variant is a folder of files that replace static/'s (`chat/chat.css`, `chat/live.js`, …),
served to the page through Playwright's routing; `base` is static/ as it is. One chatsite
process (the embedded demo model at full speed) answers every run; each round runs every
variant once, in an order that alternates from round to round, so a machine that gets busier
or quieter during the run weighs on each variant alike. Printed: the median of each measure
over the rounds and the load average at each run (the machine is shared). With `--trace`, a
Chromium performance trace per run, and for each long task the events it spent its time in
(self time), from the trace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import browser as bench_browser
from bench import procs

STATIC = procs.ROOT / "static"
PHONE = {
    "viewport": {"width": 360, "height": 740},
    "is_mobile": True,
    "has_touch": True,
    "device_scale_factor": 3,
}
DESKTOP = {"viewport": {"width": 1280, "height": 900}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FOLDER")
    parser.add_argument("--no-base", action="store_true", help="leave static/ as it is out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--answer", default="markdown", choices=("markdown", "long"))
    parser.add_argument("--device", default="desktop", choices=("desktop", "phone"))
    parser.add_argument(
        "--cpu-slowdown",
        type=float,
        default=1.0,
        metavar="N",
        help="Chromium's CPU throttling: the page runs as on a device N times slower",
    )
    parser.add_argument("--trace", type=Path, help="a folder for a performance trace per run")
    parser.add_argument("--profile", action="store_true", help="traces with JS stacks (slower)")
    parser.add_argument("--json", type=Path, help="write every run's results there")
    args = parser.parse_args()
    variants: dict[str, Path | None] = {} if args.no_base else {"base": None}
    for spec in args.variant:
        name, _, folder = spec.partition("=")
        variants[name] = Path(folder).resolve()
    runs = asyncio.run(_runs(args, variants))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    _report(runs, list(variants))


async def _runs(args: argparse.Namespace, variants: dict[str, Path | None]) -> list[dict[str, Any]]:
    from playwright.async_api import async_playwright

    workdir = Path(tempfile.mkdtemp(prefix="browser-ab-"))
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        database = procs.migrated_database(workdir)
        cookie = procs.make_users(database, 1, "bench-ab-")[0]["sessionid"]
        site = stack.enter_context(
            procs.chatsite(database, "", DEMO_TOKENS_PER_SECOND="0", DEMO_TTFB_MS="100")
        )
        if args.trace:
            args.trace.mkdir(parents=True, exist_ok=True)
        async with async_playwright() as pw:
            chromium = await pw.chromium.launch(
                executable_path=bench_browser.CHROMIUM, args=bench_browser.ARGS
            )
            try:
                names = list(variants)
                for round_ in range(args.rounds):
                    order = names if round_ % 2 == 0 else names[::-1]
                    for name in order:
                        load = os.getloadavg()[0]
                        trace = args.trace / f"{name}-{round_}.json" if args.trace else None
                        result = await bench_browser._one(
                            chromium,
                            "chatsite",
                            site.base,
                            "",
                            cookie,
                            args.tokens,
                            60.0,
                            args.answer,
                            context_options=PHONE if args.device == "phone" else DESKTOP,
                            prepare=_serving(variants[name]),
                            trace=trace,
                            profile=args.profile,
                            cpu_slowdown=args.cpu_slowdown,
                        )
                        result.update(variant=name, round=round_, load=round(load, 2))
                        if trace is not None and trace.exists():
                            result.update(main_thread_cpu(trace))
                            result["long_task_breakdown"] = long_task_breakdown(trace)
                        runs.append(result)
                        procs.log(_line(result))
            finally:
                await chromium.close()
    return runs


def _serving(folder: Path | None) -> Any:
    """A `prepare` that serves `folder`'s files in place of static/'s (None: nothing to do)."""
    if folder is None:
        return None

    async def prepare(context: Any) -> None:
        async def handle(route: Any) -> None:
            path = route.request.url.split("/static/", 1)[1].split("?", 1)[0]
            override = folder / path
            if override.is_file():
                kind = "text/css" if path.endswith(".css") else "text/javascript"
                await route.fulfill(body=override.read_bytes(), content_type=kind)
            else:
                await route.continue_()

        await context.route("**/static/**", handle)

    return prepare


MEASURES = (
    ("cpu_longest_task_ms", "CPU longest"),
    ("cpu_tbt_ms", "CPU TBT"),
    ("cpu_end_task_ms", "CPU end task"),
    ("cpu_tasks_ms", "CPU all tasks"),
    ("cpu_layout_ms", "CPU layout"),
    ("longest_task_ms", "longest"),
    ("total_blocking_ms", "TBT"),
    ("long_tasks", "long tasks"),
    ("end_task_ms", "end task"),
    ("heap_peak_mib", "heap MiB"),
    ("app_paint_ms", "paint cb ms"),
    ("layout_ms", "layout ms"),
    ("style_ms", "style ms"),
    ("stream_ms", "stream ms"),
)


def _line(result: dict[str, Any]) -> str:
    paint = result.get("chunk_to_paint_ms", {})
    measures = " ".join(f"{label}={result.get(key)}" for key, label in MEASURES)
    return (
        f"{result['variant']} r{result['round']} load={result['load']} {measures}"
        f" c2p p50/p95/p99={paint.get('p50')}/{paint.get('p95')}/{paint.get('p99')}"
        f" tasks={result.get('long_task_list')} {result.get('error', '')}"
    )


def _report(runs: list[dict[str, Any]], names: list[str]) -> None:
    columns = [label for _, label in MEASURES] + ["c2p p50", "c2p p95", "c2p p99", "loads"]
    print("| variant | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name in names:
        mine = [r for r in runs if r["variant"] == name and "error" not in r]
        cells = [_median([r.get(key) for r in mine]) for key, _ in MEASURES]
        for p in ("p50", "p95", "p99"):
            cells.append(_median([r.get("chunk_to_paint_ms", {}).get(p) for r in mine]))
        cells.append(" ".join(str(r["load"]) for r in mine))
        print(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")


def _median(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(numbers), 1) if numbers else "-"


def _main_thread(events: list[dict[str, Any]]) -> set[tuple[Any, Any]]:
    return {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "thread_name"
        and e.get("args", {}).get("name") == "CrRendererMain"
    }


def main_thread_cpu(path: Path) -> dict[str, float]:
    """The page's main thread from a trace, in its thread's CPU time (`tdur`), which a loaded
    machine does not inflate as it does wall time (a task descheduled for 300 ms is 300 ms
    longer on the wall clock, not in CPU time): every task, the longest, the blocking time
    (CPU over 50 ms per task), the end (the task that swapped in the answer's final HTML) and
    the layout."""
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    main = _main_thread(events)
    mine = [e for e in events if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in main]
    tasks = [e for e in mine if e["name"] == "RunTask" and "tdur" in e]
    cpu = [e["tdur"] / 1000 for e in tasks]
    layout = sum(e.get("tdur", 0) for e in mine if e["name"] == "Layout") / 1000
    # The end: the largest task that swapped an HTML frame's out-of-band fragments (the final
    # HTML of the answer is one; the others, the bubbles and the sidebar, are small).
    swaps = [
        e
        for e in mine
        if e["name"] == "EventDispatch"
        and (e.get("args", {}).get("data") or {}).get("type") == "htmx:oobAfterSwap"
    ]
    end = max(
        (t["tdur"] / 1000 for t in tasks for w in swaps if t["ts"] <= w["ts"] < t["ts"] + t["dur"]),
        default=0.0,
    )
    return {
        "cpu_tasks_ms": round(sum(cpu), 1),
        "cpu_longest_task_ms": round(max(cpu, default=0), 1),
        "cpu_tbt_ms": round(sum(max(0.0, c - 50) for c in cpu), 1),
        "cpu_end_task_ms": round(end, 1),
        "cpu_layout_ms": round(layout, 1),
    }


def long_task_breakdown(path: Path, threshold_ms: float = 50) -> list[dict[str, Any]]:
    """For each task over `threshold_ms` on the page's main thread: its start, its length and the
    trace events it spent its time in (self time, ms, the largest first)."""
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    main = _main_thread(events)
    spans = [
        e
        for e in events
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in main and "dur" in e
    ]
    spans.sort(key=lambda e: (e["ts"], -e["dur"]))
    tasks = [e for e in spans if e["name"] == "RunTask" and e["dur"] > threshold_ms * 1000]
    out = []
    for task in tasks:
        start, end = task["ts"], task["ts"] + task["dur"]
        inside = [
            e
            for e in spans
            if e is not task and e["pid"] == task["pid"] and start <= e["ts"] and e["ts"] < end
        ]
        self_time: dict[str, float] = defaultdict(float)
        stack: list[tuple[dict[str, Any], float]] = []  # (event, its end)
        for event in inside:
            while stack and stack[-1][1] <= event["ts"]:
                stack.pop()
            if stack:
                self_time[_label(stack[-1][0])] -= event["dur"]
            self_time[_label(event)] += event["dur"]
            stack.append((event, event["ts"] + event["dur"]))
        top = sorted(self_time.items(), key=lambda kv: -kv[1])[:12]
        out.append(
            {
                "start_ms": round(start / 1000),
                "ms": round(task["dur"] / 1000, 1),
                "self_ms": {k: round(v / 1000, 1) for k, v in top if v > 500},
            }
        )
    return out


def _label(event: dict[str, Any]) -> str:
    data = event.get("args", {}).get("data", {}) or {}
    if event["name"] in ("FunctionCall", "EvaluateScript", "TimerFire", "EventDispatch"):
        where = data.get("functionName") or data.get("type") or ""
        url = (data.get("url") or "").rsplit("/", 1)[-1]
        line = data.get("lineNumber")
        return f"{event['name']} {where} {url}:{line}".strip()
    return event["name"]


if __name__ == "__main__":
    main()
