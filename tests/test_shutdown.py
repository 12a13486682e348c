"""Graceful shutdown of a real daphne process: SIGTERM mid-answer, with and without time left."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from chat.logging import current_turn, turn_context
from chat.ops import shutdown
from tests.servers import migrated_sqlite, signup
from tests.test_daphne import (
    Instance,
    chat_socket,
    daphne_instance,
    new_username,
    read_answer,
    ready,
    send_prompt,
)

CLOSE_RESTARTING = 4503  # reconnect (to another instance)
INTERRUPTED = "The answer was interrupted"


def sqlite_row(database_url: str, mid: str) -> tuple[str, str, str]:
    path = database_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT status, text, error FROM chat_message WHERE mid = ?", (mid,)
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def streaming_count(database_url: str) -> int:
    path = database_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM chat_message WHERE status = 'streaming'"
        ).fetchone()
    return int(count)


@pytest.fixture
def database_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="chatsite-shutdown-") as workdir:
        yield migrated_sqlite(Path(workdir))


def terminate(instance: Instance) -> None:
    instance.proc.send_signal(signal.SIGTERM)


async def close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes the socket; its close code."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 15)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


async def test_sigterm_saves_an_answer_that_outlives_the_grace_as_failed_with_its_text(
    database_url: str,
) -> None:
    with daphne_instance(
        "web1",
        database_url=database_url,
        DEMO_TOKENS_PER_SECOND="200",
        CHAT_SHUTDOWN_GRACE="1",
    ) as web1:
        client = signup(web1.base, new_username())
        async with chat_socket(web1.base, client) as ws:
            await ready(ws)
            await send_prompt(ws, "/long 5000")  # 25 s: far longer than the grace
            answer = await read_answer(ws, until_chunks=3)
            terminate(web1)
            # The tab keeps receiving during the grace, then gets the outcome, then 4503.
            answer = await read_answer(ws, answer, timeout=15)
            code = await close_code(ws)
        assert web1.proc.wait(timeout=15) == 0
    assert answer.done is not None
    assert answer.done["status"] == "failed"
    assert INTERRUPTED in answer.done["error"]
    assert code == CLOSE_RESTARTING
    status, text, error = sqlite_row(database_url, answer.mid or "")
    assert (status, text) == ("failed", answer.text)
    assert text and len(text.split()) < 5000
    assert INTERRUPTED in error
    assert streaming_count(database_url) == 0


async def test_sigterm_lets_a_short_answer_finish_and_stops_taking_connections(
    database_url: str,
) -> None:
    with daphne_instance(
        "web1",
        database_url=database_url,
        DEMO_TOKENS_PER_SECOND="200",
        CHAT_SHUTDOWN_GRACE="20",
    ) as web1:
        client = signup(web1.base, new_username())
        # A keep-alive connection opened before the signal can still ask for readiness.
        probe = httpx.AsyncClient(base_url=web1.base, timeout=5)
        assert (await probe.get("/readyz")).status_code == 200
        async with chat_socket(web1.base, client) as ws:
            await ready(ws)
            await send_prompt(ws, "/long 300")  # 1.5 s: well inside the grace
            answer = await read_answer(ws, until_chunks=3)
            terminate(web1)
            await asyncio.sleep(0.3)  # let the signal land (the answer keeps streaming)
            draining = await probe.get("/readyz")
            async with httpx.AsyncClient(timeout=2) as fresh:
                with pytest.raises(httpx.ConnectError):
                    await fresh.get(f"{web1.base}/healthz")  # a new connection: not listening
            # A prompt on a socket that is already open is not started while draining.
            await ws.send(json.dumps({"type": "prompt", "conversation": "", "text": "/echo x"}))
            answer = await read_answer(ws, answer, timeout=15)
            code = await close_code(ws)
        await probe.aclose()
        assert web1.proc.wait(timeout=15) == 0
    assert draining.status_code == 503
    assert draining.json()["checks"]["shutdown"]["ok"] is False
    assert answer.done is not None
    assert answer.done["status"] == "complete"
    assert len(answer.text.split()) == 300
    assert [e["code"] for e in answer.errors] == ["unavailable"]
    assert code == CLOSE_RESTARTING
    assert sqlite_row(database_url, answer.mid or "")[:2] == ("complete", answer.text)
    assert streaming_count(database_url) == 0


def test_outside_daphne_the_shutdown_hook_is_not_installed() -> None:
    # Under pytest there is no running Twisted reactor: nothing to hook, nothing imported.
    assert shutdown.install() is False


async def test_the_drain_runs_outside_the_turn_the_signal_interrupted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twisted schedules the stop from its SIGTERM handler with call_soon_threadsafe, which
    copies the context the signal interrupted: a turn's. The drain must not log as that turn
    ("shutting down" carried turn=…, mid=…, user=… of someone's answer in a used cluster)."""
    seen: list[object] = []

    async def drain_safely() -> None:
        seen.append(current_turn())

    monkeypatch.setattr(shutdown, "_drain_safely", drain_safely)
    with turn_context("1796143210731-web1-21", conversation="c", user=7):
        task = shutdown.start_drain()
    await task
    assert seen == [None]
