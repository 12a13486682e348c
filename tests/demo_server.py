"""Test support: run the demo model as a real standalone server in a subprocess.

`running_demo_server()` starts `python -m chat.demo_upstream` exactly as a developer would.
`running_demo_server(stats=True)` starts this module instead: the same DemoModel served the
same way, plus `GET /_test/stats` reporting the model's counters and the client ports of the
requests it saw, so tests can prove from the outside that a cancelled stream stopped and that
turns reuse one connection. That window exists only here, never in the product.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
STARTUP_SECONDS = 30.0
STATS_PATH = "/_test/stats"


@contextlib.contextmanager
def running_demo_server(
    ttfb_ms: int = 0, tps: float = 0, *, stats: bool = False, port: int = 0
) -> Iterator[str]:
    """Start a demo model server; yield its base URL `http://127.0.0.1:PORT/v1`; stop it.

    `port=0` lets the server pick a free port and we read it from the line it prints: that
    avoids the race of choosing a free port here and binding it there.
    """
    with demo_process(ttfb_ms, tps, stats=stats, port=port) as (_, base_url):
        yield base_url


@contextlib.contextmanager
def demo_process(
    ttfb_ms: int = 0, tps: float = 0, *, stats: bool = False, port: int = 0
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`running_demo_server`, also giving the process (the benchmarks read its CPU time)."""
    module = "tests.demo_server" if stats else "chat.demo_upstream"
    command = [sys.executable, "-m", module, "--port", str(port), "--ttfb-ms", str(ttfb_ms)]
    command += ["--tps", str(tps)]
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            base_url = _read_base_url(process, stderr)
            _wait_until_answering(base_url)
            yield process, base_url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            assert process.stdout is not None
            process.stdout.close()


def _read_base_url(process: subprocess.Popen[bytes], stderr: Any) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], STARTUP_SECONDS)
    line = process.stdout.readline().decode() if ready else ""
    if "listening on" not in line:
        stderr.seek(0)
        raise RuntimeError(
            f"the demo server did not start: {line!r}\n{stderr.read().decode(errors='replace')}"
        )
    return line.rsplit(" ", 1)[-1].strip()


def _wait_until_answering(base_url: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            if httpx.get(f"{base_url}/models", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def demo_stats(base_url: str) -> dict[str, Any]:
    """The counters of a server started with `stats=True` (see the module docstring)."""
    origin = base_url.rsplit("/", 1)[0]
    response = httpx.get(origin + STATS_PATH, timeout=5, trust_env=False)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


@dataclass
class AppResponse:
    """What an in-process call of the demo ASGI app sent back."""

    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body_messages: list[bytes] = field(default_factory=list)
    finished: bool = False  # a body message with more_body False was sent
    error: BaseException | None = None
    sends_after_disconnect: int = 0

    @property
    def body(self) -> bytes:
        return b"".join(self.body_messages)

    def json(self) -> Any:
        return json.loads(self.body)


async def call_demo_app(
    app: Any,
    method: str,
    path: str,
    payload: Any = None,
    *,
    disconnect_after_body_messages: int | None = None,
) -> AppResponse:
    """Call the ASGI app with a fake server: this is how daphne drives it, minus the socket.

    With `disconnect_after_body_messages`, the client "leaves" once that many body messages
    arrived: `receive()` then returns `http.disconnect`, as daphne's does.
    """
    request_body = b"" if payload is None else json.dumps(payload).encode()
    left = asyncio.Event()
    request_sent = False
    result = AppResponse()

    async def receive() -> dict[str, Any]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": request_body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if left.is_set():
            result.sends_after_disconnect += 1
            return
        if message["type"] == "http.response.start":
            result.status = message["status"]
            result.headers = dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            result.body_messages.append(message.get("body", b""))
            result.finished = not message.get("more_body", False)
        if (
            disconnect_after_body_messages is not None
            and len(result.body_messages) >= disconnect_after_body_messages
        ):
            left.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    try:
        await app(scope, receive, send)
    except Exception as exc:
        result.error = exc
    return result


class StatsWindow:
    """Wraps the demo app: answers STATS_PATH, records each request's path and client port."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.requests: list[tuple[str, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == STATS_PATH:
            body = json.dumps({**self.model.stats, "requests": self.requests}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http":
            client = scope.get("client") or ("", 0)
            self.requests.append((scope["path"], int(client[1])))
        # Pass `send` through untouched: /cut recognises daphne's own send callable.
        await self.model(scope, receive, send)


def main() -> None:
    from chat.demo_upstream import DemoModel, serve

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttfb-ms", type=int, default=0)
    parser.add_argument("--tps", type=float, default=0)
    args = parser.parse_args()
    model = DemoModel(prefix="/v1", ttfb_ms=args.ttfb_ms, tokens_per_second=args.tps)
    serve(StatsWindow(model), "127.0.0.1", args.port, model.prefix)


if __name__ == "__main__":
    main()
