"""PNG plots of a benchmark run (matplotlib, no display) for docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on a server or in CI
import matplotlib.pyplot as plt

from bench.report import SIDE_NAMES

COLORS = {
    "direct": "#555555",
    "chatsite": "#1f77b4",
    "chatsite_redis": "#2ca02c",
    "chatsite_x2": "#9467bd",
    "naive": "#d62728",
    "litellm": "#ff7f0e",
}


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def relay_plot(relay: dict[str, Any], out: Path) -> Path:
    """TTFT percentiles, CPU per 1,000 tokens and frames per answer against N."""
    ns = list(relay["by_n"])
    sides = list(next(iter(relay["by_n"].values())))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ttft, cpu, delay = axes
    for side in sides:
        color = COLORS.get(side)
        xs = [int(n) for n in ns]
        for q, style in (("p50", "-"), ("p99", ":")):
            ys = [relay["by_n"][n][side]["ttft_ms"].get(q) for n in ns]
            label = f"{SIDE_NAMES.get(side, side)} {q}"
            ttft.plot(xs, ys, style, marker="o", color=color, label=label)
        ys = [relay["by_n"][n][side]["token_delay_ms"].get("p99") for n in ns]
        delay.plot(xs, ys, "-", marker="o", color=color, label=SIDE_NAMES.get(side, side))
        if side != "direct":
            ys = [relay["by_n"][n][side].get("server_cpu_ms_per_1k_tokens") for n in ns]
            cpu.plot(xs, ys, "-", marker="o", color=color, label=SIDE_NAMES.get(side, side))
    ttft.set(
        title="Time to first token (ms)", xlabel="concurrent answers N", xscale="log", yscale="log"
    )
    cpu.set(title="Relay CPU ms per 1,000 tokens", xlabel="concurrent answers N", xscale="log")
    delay.set(
        title="Per-token delivery delay p99 (ms)",
        xlabel="concurrent answers N",
        xscale="log",
        yscale="log",
    )
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out / "relay_cost.png")


def rate_plot(capacity: dict[str, Any], out: Path) -> Path:
    rate = capacity["turn_rate"]
    cs = list(rate)
    sides = list(next(iter(rate.values())))
    fig, (ax, lat) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = [int(c) for c in cs]
    for side in sides:
        color = COLORS.get(side)
        ax.plot(
            xs,
            [rate[c][side]["turns_per_s"] for c in cs],
            marker="o",
            color=color,
            label=SIDE_NAMES.get(side, side),
        )
        lat.plot(
            xs,
            [rate[c][side]["done_ms"].get("p95") for c in cs],
            marker="o",
            color=color,
            label=SIDE_NAMES.get(side, side),
        )
    ax.plot(xs, [rate[c][sides[0]]["ideal_turns_per_s"] for c in cs], "k--", label="ideal")
    ax.axhline(320, color="orange", linestyle=":", label="seed post: 320 requests/s")
    ax.set(title="Complete chat turns per second", xlabel="concurrent clients")
    lat.set(title="Turn time p95 (ms)", xlabel="concurrent clients")
    for a in (ax, lat):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    return _save(fig, out / "turn_rate.png")


def browser_plot(browser: dict[str, Any], out: Path) -> Path | None:
    runs = [r for r in browser.get("runs", []) if r.get("complete") is not None]
    if not runs:
        return None
    labels = [
        f"{r['renderer']}\n{r['tokens']} tok"
        + (f"\n@{r['tokens_per_second']:g}/s" if r.get("tokens_per_second") else "")
        for r in runs
    ]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    palette = {"chatsite": "#1f77b4", "naive": "#ff7f0e", "naive+relay": "#d62728"}
    colors = [palette.get(r["renderer"], "#7f7f7f") for r in runs]
    for ax, key, title in (
        (axes[0], "total_blocking_ms", "Total blocking time (ms)"),
        (axes[1], "longest_task_ms", "Longest task (ms)"),
        (axes[2], "heap_peak_mib", "JS heap peak (MiB)"),
    ):
        ax.bar(range(len(runs)), [r.get(key) or 0 for r in runs], color=colors)
        ax.set_xticks(range(len(runs)), labels, fontsize=7, rotation=45, ha="right")
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].axhline(100, color="orange", linestyle=":", label="target ≤ 100 ms")
    axes[1].axhline(100, color="orange", linestyle=":", label="target: none > 100 ms")
    axes[2].axhline(50, color="orange", linestyle=":", label="target ≤ 50 MiB")
    for ax in axes:
        ax.legend(fontsize=8)
    return _save(fig, out / "browser.png")


def write_all(results: dict[str, Any], out: Path) -> list[Path]:
    written: list[Path] = []
    if results.get("relay", {}).get("by_n"):
        written.append(relay_plot(results["relay"], out))
    if results.get("capacity", {}).get("turn_rate"):
        written.append(rate_plot(results["capacity"], out))
    if "browser" in results:
        path = browser_plot(results["browser"], out)
        if path is not None:
            written.append(path)
    return written
