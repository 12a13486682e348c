"""Distributions as the benchmarks report them: count, median, p95, p99, min, max."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bench.clients import TurnRecord


def dist(values: Iterable[float], scale: float = 1.0, digits: int = 2) -> dict[str, Any]:
    """Percentiles of `values` times `scale` (1000 turns seconds into ms); empty → only n = 0."""
    array = np.asarray(list(values), dtype=float) * scale
    if array.size == 0:
        return {"n": 0}
    p50, p95, p99 = np.percentile(array, [50, 95, 99])
    return {
        "n": int(array.size),
        "p50": round(float(p50), digits),
        "p95": round(float(p95), digits),
        "p99": round(float(p99), digits),
        "mean": round(float(array.mean()), digits),
        "min": round(float(array.min()), digits),
        "max": round(float(array.max()), digits),
    }


def turns_summary(records: Sequence[TurnRecord], tokens_per_second: float) -> dict[str, Any]:
    """What a set of answers looked like to their clients (times in ms)."""
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = r.error or f"{len(r.token_times)}/{r.tokens_expected} tokens"
            errors[key] = errors.get(key, 0) + 1
    delays = [d for r in ok for d in r.token_delays(tokens_per_second)]
    return {
        "turns": len(records),
        "ok": len(ok),
        "errors": errors,
        "tokens": sum(len(r.token_times) for r in records),
        "ttft_ms": dist((r.ttft for r in ok if r.ttft is not None), 1000),
        "last_token_ms": dist((r.last_token for r in ok if r.last_token is not None), 1000),
        "done_ms": dist((r.done for r in ok if r.done is not None), 1000),
        "token_delay_ms": dist(delays, 1000),
        "frames_per_answer": dist((r.frames for r in ok), 1, 1),
    }


def difference(side: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """side minus base at each percentile: the two sets of turns are not paired one to one."""
    return {
        q: round(side[q] - base[q], 2) for q in ("p50", "p95", "p99") if q in side and q in base
    }


def ratio(side: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    return {
        q: round(side[q] / base[q], 4)
        for q in ("p50", "p95", "p99")
        if q in side and q in base and base[q]
    }
