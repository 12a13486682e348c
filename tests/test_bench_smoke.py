"""The benchmark harness (`make bench`) runs end to end at its tiniest size and writes its JSON.

Nothing here looks at a timing: benchmarks are not tests. These check that every side of every
comparison ran, that the answers arrived whole, and that the results and plots were written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.test_daphne import POSTGRES_ADMIN_URL, needs_postgres

ROOT = Path(__file__).resolve().parent.parent


def run_bench(out: Path, sections: str, *extra: str) -> dict[str, Any]:
    # --out keeps the harness from writing into the repository.
    command = [sys.executable, "-m", "bench.run", "--quick", "--tiny", "--only", sections, *extra]
    done = subprocess.run(
        [*command, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


@pytest.mark.timeout(300)
def test_the_quick_benchmark_measures_every_side_and_writes_its_results(tmp_path: Path) -> None:
    results = run_bench(tmp_path, "relay,turn_cpu,capacity,reuse,first_turn")

    assert results["meta"]["config"]["mode"] == "quick-tiny"
    by_n = results["relay"]["by_n"]
    assert set(by_n) == {"1", "2"}
    # The quick run never installs or starts the peer (LiteLLM): only --full or --peer do.
    assert "peer" not in results
    for sides in by_n.values():
        assert {"direct", "chatsite", "naive"} <= set(sides)
        assert "litellm" not in sides
        for name, side in sides.items():
            # Every answer arrived whole on every side (the clients check the text length).
            assert side["turns"] > 0 and side["ok"] == side["turns"], (name, side["errors"])
            assert side["ttft_ms"]["n"] == side["turns"]
        assert "server_cpu_ms_per_1k_tokens" in sides["chatsite"]
        assert "added_ttft_ms" in sides["chatsite"]
    # CPU per turn: every turn of every burst answered whole, and its CPU read from /proc.
    turn_cpu = results["turn_cpu"]["chatsite"]
    assert turn_cpu["turns"] == 3 and len(turn_cpu["bursts"]) == 1
    for burst in turn_cpu["bursts"]:
        assert burst["ok"] == burst["turns"] == 3, burst["errors"]
        assert burst["server_cpu_ms"] > 0
    assert turn_cpu["median_cpu_ms_per_turn"] > 0
    assert "median_cpu_ms_per_1k_tokens" in turn_cpu
    idle = results["capacity"]["idle"]["chatsite"]
    assert idle["held"] == idle["sockets"]
    assert set(results["capacity"]["turn_rate"]["2"]) >= {"direct", "chatsite", "naive"}
    # The naive relay opens a connection per turn; chatsite reuses its pool.
    reuse = results["reuse"]
    assert reuse["naive"]["connections_used"] == reuse["naive"]["turns"]
    assert reuse["chatsite"]["connections_used"] <= reuse["chatsite"]["concurrency"] + 1
    assert {"cold", "warmed", "second"} == set(results["first_turn"])
    assert (tmp_path / "results.md").read_text().startswith("# Benchmark run (quick-tiny)")
    assert "## CPU per turn" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "relay_cost.png").stat().st_size > 0
    assert (tmp_path / "turn_rate.png").stat().st_size > 0


@needs_postgres
@pytest.mark.timeout(300)
def test_the_turn_cpu_burst_runs_on_postgresql_and_drops_its_databases(tmp_path: Path) -> None:
    results = run_bench(
        tmp_path, "turn_cpu", "--sides", "chatsite", "--postgres", POSTGRES_ADMIN_URL
    )

    assert results["meta"]["database"] == "postgresql"
    burst = results["turn_cpu"]["chatsite"]["bursts"][0]
    assert burst["ok"] == burst["turns"] == 3, burst["errors"]
    assert burst["server_cpu_ms"] > 0
    # The run's template and its server's database are gone after it.
    names = results["meta"]["postgres_databases"]
    assert names.startswith("bench_")
    with psycopg.connect(POSTGRES_ADMIN_URL) as admin:
        left = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (names,))
        assert left.fetchall() == []


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_the_browser_benchmark_streams_with_every_renderer(tmp_path: Path) -> None:
    from tests.browser.browsing import CHROMIUM

    if not Path(CHROMIUM).exists():  # as every browser test (.ci/run installs it)
        pytest.skip(f"no Chromium at {CHROMIUM} (set CHATSITE_CHROMIUM to its path)")
    results = run_bench(tmp_path, "browser")

    runs = results["browser"]["runs"]
    assert [r["renderer"] for r in runs] == [
        "chatsite",
        "naive",
        "naive+relay",
        "chatsite, markdown",  # the demo model's /markdown: what live rendering works on
        "naive, markdown",
    ]
    for run in runs:
        assert run.get("complete") is True, run
        assert run["chunk_frames"] >= 1
        assert run["heap_peak_mib"] is not None
    # A frame per token from the naive relay: 50 tokens, 50 frames.
    assert runs[2]["chunk_frames"] == 50
    assert (tmp_path / "browser.png").stat().st_size > 0
