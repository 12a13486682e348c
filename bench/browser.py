"""Browser benchmark: headless Chromium streams long answers; long tasks, heap, chunk → paint.

Three renderers, each on a fresh page, for each answer size, at the demo model's full speed:
  - "chatsite": the real chat page (static/chat/answers.js and live.js: the blocks the server
    rendered placed as they come, the open tail previewed, painted per animation frame);
  - "naive": bench/naive_renderer.html on chatsite's socket (coalesced frames), re-rendering
    the whole answer's markdown on every chunk;
  - "naive+relay": the same page on bench/naive_relay.py, which sends a frame per token.
The answers are the demo model's `/long` prose; "chatsite, markdown" and "naive, markdown" are
the first two with `/markdown` (headings, lists, tables, math, code every ~300 tokens), what
live rendering works hardest on (issue 15).
bench/instrument.js is injected before the page's scripts; nothing of it is in the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from bench import procs
from bench.summary import dist


class Bench(Protocol):
    """What this section needs of the harness (bench.run.Bench): no import back up to it."""

    config: Any
    stack: contextlib.ExitStack

    def database(self, name: str) -> str: ...


HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--enable-precise-memory-info",  # performance.memory without its 100 KB rounding
]
NAIVE_PATH = "/__bench/naive/"
# What a performance trace records: DevTools' timeline (tasks, parse, style, layout, paint,
# scripts), each event with its wall and its thread's CPU time; with `profile`, also the V8
# sampling profiler's stacks (which functions the scripts spent their time in).
TRACE = [
    "devtools.timeline",
    "disabled-by-default-devtools.timeline",
    "disabled-by-default-devtools.timeline.frame",
    "v8.execute",
    "blink",
]
PROFILE = [*TRACE, "disabled-by-default-v8.cpu_profiler"]
COLLECT = """() => {
  const b = window.__bench;
  const tasks = (b.longTasks || [])
    .filter(([start]) => start >= b.t0)
    .map(([start, duration]) => [start - b.t0, duration]);
  return {
    longTasksSupported: b.longTasks !== null,
    tasks,
    chunkFrames: b.chunkFrames,
    chunkToPaint: b.chunkToPaint,
    htmlFrames: b.htmlFrames.map(([t, length]) => [t - b.t0, length]),
    heapPeak: b.heap.length ? Math.max(...b.heap) : null,
    heapLast: b.heap.length ? b.heap[b.heap.length - 1] : null,
    appRafCallbacks: b.appRafCallbacks,
    appRafMs: b.appRafMs,
    nodes: document.getElementsByTagName("*").length,
  };
}"""


async def run(
    bench: Bench,
    sizes: list[int],
    paced: list[tuple[int, float]],
    markdown: Sequence[int] = (),
) -> dict[str, Any]:
    """Each size at full speed with the three renderers; each (size, tokens/s) paced, so that
    the answer arrives in hundreds of frames, with the two renderers on chatsite's socket;
    each `markdown` size not among `sizes` as a `/markdown` answer on chatsite's page only."""
    if not _chromium_installed():
        return {"skipped": f"{CHROMIUM} not found"}
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return {"skipped": "playwright is not installed"}
    database = bench.database("browser")
    cookie = procs.make_users(database, 1, "bench-browser-")[0]["sessionid"]
    fast_demo = bench.stack.enter_context(procs.demo_model(100, 0))
    naive = bench.stack.enter_context(procs.naive_relay(fast_demo.base))
    # The embedded demo model at full speed (DEMO_TOKENS_PER_SECOND=0) on the app's own port.
    # The naive page is served from the relay's origin and opens chatsite's socket: trust it.
    site = bench.stack.enter_context(
        procs.chatsite(
            database,
            "",
            DEMO_TOKENS_PER_SECOND="0",
            DEMO_TTFB_MS="100",
            DJANGO_CSRF_TRUSTED_ORIGINS=naive.base,
        )
    )
    # Paced answers: a second chatsite process on the same database (so the same session)
    # whose upstream is a demo model at a fixed number of tokens per second.
    paced_sites = {}
    for _, tps in paced:
        demo = bench.stack.enter_context(procs.demo_model(100, tps))
        paced_sites[tps] = bench.stack.enter_context(procs.chatsite(database, demo.base))
    # A frame per token with a full re-render each is quadratic: cap how long we wait for it.
    cap = 40.0 if bench.config.mode.startswith("full") else 20.0
    runs: list[dict[str, Any]] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for tokens in sizes:
                for renderer in ("chatsite", "naive", "naive+relay"):
                    procs_log(f"browser: {renderer}, {tokens} tokens")
                    runs.append(
                        await _one(browser, renderer, site.base, naive.base, cookie, tokens, cap)
                    )
                for renderer in ("chatsite", "naive"):
                    procs_log(f"browser: {renderer}, {tokens} tokens of markdown")
                    run = await _one(
                        browser, renderer, site.base, naive.base, cookie, tokens, cap, "markdown"
                    )
                    runs.append({**run, "renderer": f"{renderer}, markdown"})
            for tokens in [n for n in markdown if n not in sizes]:
                procs_log(f"browser: chatsite, {tokens} tokens of markdown")
                run = await _one(
                    browser, "chatsite", site.base, naive.base, cookie, tokens, cap, "markdown"
                )
                runs.append({**run, "renderer": "chatsite, markdown"})
            for tokens, tps in paced:
                for renderer in ("chatsite", "naive"):
                    procs_log(f"browser: {renderer}, {tokens} tokens at {tps:g} tokens/s")
                    run = await _one(
                        browser,
                        renderer,
                        paced_sites[tps].base,
                        naive.base,
                        cookie,
                        tokens,
                        cap + tokens / tps,
                    )
                    runs.append({**run, "tokens_per_second": tps})
        finally:
            await browser.close()
    return {"chromium": CHROMIUM, "args": ARGS, "cap_s": cap, "runs": runs}


async def _one(
    browser: Any,
    renderer: str,
    base: str,
    naive: str,
    cookie: str,
    tokens: int,
    cap: float,
    answer: str = "long",
    *,
    context_options: dict[str, Any] | None = None,
    prepare: Callable[[Any], Awaitable[None]] | None = None,
    trace: Path | None = None,
    profile: bool = False,
    cpu_slowdown: float = 1.0,
) -> dict[str, Any]:
    """One answer on a fresh page. `context_options` (a phone's viewport), `prepare` (run on the
    new context: bench/browser_ab.py serves a variant's static files through it), `trace`
    (a Chromium performance trace of the answer, written there) and `cpu_slowdown` (Chromium's
    CPU throttling: a page on a device that many times slower) are for bench/browser_ab.py."""
    options = context_options or {"viewport": {"width": 1280, "height": 900}}
    context = await browser.new_context(**options)
    result: dict[str, Any] = {"renderer": renderer, "tokens": tokens}
    tracing = False
    try:
        await context.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
        await context.add_init_script(path=str(HERE / "instrument.js"))
        if prepare is not None:
            await prepare(context)
        page = await context.new_page()
        cdp = await context.new_cdp_session(page)
        await cdp.send("Performance.enable")
        if cpu_slowdown > 1:
            await cdp.send("Emulation.setCPUThrottlingRate", {"rate": cpu_slowdown})
        prompt = f"/{answer} {tokens}"
        if renderer == "chatsite":
            await page.goto(base + "/")
            await page.wait_for_selector('#connection[data-state="connected"]', timeout=15_000)
            await page.fill("#prompt", prompt)
            await page.evaluate("window.__bench.reset()")
            if trace is not None:
                await browser.start_tracing(
                    page=page, path=str(trace), categories=PROFILE if profile else TRACE
                )
                tracing = True
            started = time.perf_counter()
            if options.get("has_touch"):
                await page.tap("#send")  # on a touch screen Return is a new line
            else:
                await page.press("#prompt", "Enter")
            done_selector = 'article.msg-assistant[data-status="complete"]'
        else:
            url = naive + NAIVE_PATH
            if renderer == "naive":  # the naive page on chatsite's socket
                url += "?ws=" + base.replace("http://", "ws://") + "/ws/chat/"
            await page.goto(url)
            await page.wait_for_selector(
                'body[data-status="ready"]', timeout=15_000, state="attached"
            )
            await page.evaluate("window.__bench.reset()")
            started = time.perf_counter()
            await page.evaluate("(p) => window.askNaive(p)", prompt)
            done_selector = 'body[data-status="complete"]'
        try:
            await page.wait_for_selector(done_selector, timeout=cap * 1000, state="attached")
            result["complete"] = True
            result["stream_ms"] = round((time.perf_counter() - started) * 1000)
        except Exception:
            result["complete"] = False
            result["stream_ms"] = f"> {cap * 1000:.0f}"
        await asyncio.sleep(0.6)  # long tasks are reported after they end
        if tracing:
            tracing = False
            await browser.stop_tracing()
        data = await asyncio.wait_for(page.evaluate(COLLECT), 60)
        metrics = await cdp.send("Performance.getMetrics")
        values = {m["name"]: m["value"] for m in metrics["metrics"]}
        durations = [duration for _, duration in data["tasks"]]
        # The task that handled the answer's final HTML frame (the end of the answer), if long.
        frames = sorted(data["htmlFrames"], key=lambda frame: frame[1])
        final = frames[-1][0] if frames else None
        end_tasks = [d for t, d in data["tasks"] if final is not None and t <= final <= t + d]
        result.update(
            chunk_frames=data["chunkFrames"],
            long_tasks=len(durations) if data["longTasksSupported"] else "unsupported",
            longest_task_ms=round(max(durations), 1) if durations else 0,
            total_blocking_ms=round(sum(max(0.0, d - 50) for d in durations), 1),
            end_task_ms=round(max(end_tasks), 1) if end_tasks else 0,
            # [ms after the prompt was sent, duration ms] of each long task (the worst 20)
            long_task_list=sorted(
                ([round(t), round(d)] for t, d in data["tasks"]), key=lambda x: -x[1]
            )[:20],
            chunk_to_paint_ms=dist(data["chunkToPaint"]),
            heap_peak_mib=_mib(data["heapPeak"]),
            heap_end_mib=_mib(values.get("JSHeapUsedSize")),
            dom_nodes=data["nodes"],
            app_paint_callbacks=data["appRafCallbacks"],
            app_paint_ms=round(data["appRafMs"], 1),
            layout_ms=round(values.get("LayoutDuration", 0) * 1000, 1),
            style_ms=round(values.get("RecalcStyleDuration", 0) * 1000, 1),
            script_ms=round(values.get("ScriptDuration", 0) * 1000, 1),
        )
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if tracing:
            await browser.stop_tracing()
        await context.close()
    return result


def _chromium_installed() -> bool:
    return Path(CHROMIUM).exists()


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def procs_log(message: str) -> None:
    procs.log(message)
